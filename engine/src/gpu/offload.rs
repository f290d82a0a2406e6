//! Session state to and from pinned host memory on the device's copy
//! stream.
//!
//! A [`StateStore`] keeps each session's state (its exact bytes) either on
//! the device or in page-locked host memory. `offload` and `restore` only
//! issue copies on the copy stream, ordered after the compute issued before
//! them, so a batch issued next overlaps them; [`StateStore::settle`] waits
//! for the copies and frees what they left behind (a device buffer after
//! an offload, the pinned buffer after a restore). `read` gives the bytes
//! wherever they are (export for migration); `put` brings state in
//! (import).

use std::collections::HashMap;
use std::sync::Arc;

use kernels::{Device, DeviceError, Result};

enum Place<D: Device> {
    Device(D::Buf),
    /// Offload issued: the pinned copy is valid after `settle`; the device
    /// buffer is kept until then.
    Offloading(D::Host, D::Buf),
    Host(D::Host),
    /// Restore issued: the device copy is valid for compute issued from
    /// now on; the pinned buffer is kept until `settle`.
    Restoring(D::Buf, D::Host),
}

struct Entry<D: Device> {
    bytes: usize,
    place: Place<D>,
}

/// Session states on a device, offloadable to pinned host memory.
pub struct StateStore<D: Device> {
    dev: Arc<D>,
    states: HashMap<String, Entry<D>>,
}

impl<D: Device> StateStore<D> {
    pub fn new(dev: Arc<D>) -> Self {
        Self { dev, states: HashMap::new() }
    }

    /// Drops `id`'s entry, first waiting for its copies if any are in
    /// flight: neither the pinned nor the device side of a copy may be freed
    /// before the copy stream is done with it.
    fn retire(&mut self, id: &str) -> Result<()> {
        let busy = self
            .states
            .get(id)
            .is_some_and(|e| matches!(e.place, Place::Offloading(..) | Place::Restoring(..)));
        if busy {
            self.dev.wait_copies()?;
        }
        self.states.remove(id);
        Ok(())
    }

    /// Puts `bytes` on the device as `id`'s state (replacing any).
    pub fn put(&mut self, id: &str, bytes: &[u8]) -> Result<()> {
        self.retire(id)?;
        let buf = self.dev.alloc(bytes.len())?;
        if !bytes.is_empty() {
            self.dev.upload(&buf, 0, bytes)?;
        }
        self.states.insert(id.to_string(), Entry { bytes: bytes.len(), place: Place::Device(buf) });
        Ok(())
    }

    /// Makes `buf` (`bytes` long, already on the device) `id`'s state.
    pub fn put_buf(&mut self, id: &str, buf: D::Buf, bytes: usize) -> Result<()> {
        self.retire(id)?;
        self.states.insert(id.to_string(), Entry { bytes, place: Place::Device(buf) });
        Ok(())
    }

    /// `id`'s device buffer, when its state is on the device (or a restore
    /// of it has been issued: compute issued from now on sees it).
    pub fn device_buf(&self, id: &str) -> Option<&D::Buf> {
        match &self.states.get(id)?.place {
            Place::Device(b) | Place::Restoring(b, _) => Some(b),
            _ => None,
        }
    }

    fn take(&mut self, id: &str) -> Result<Entry<D>> {
        self.states.remove(id).ok_or_else(|| DeviceError(format!("no state for session {id}")))
    }

    /// Starts moving `id`'s state to pinned host memory.
    pub fn offload(&mut self, id: &str) -> Result<()> {
        if matches!(self.states.get(id).map(|e| &e.place), Some(Place::Restoring(..))) {
            // The restore's pinned source is freed below: let it land first.
            self.dev.wait_copies()?;
        }
        let e = self.take(id)?;
        let place = match e.place {
            Place::Device(buf) | Place::Restoring(buf, _) => {
                let mut host = self.dev.alloc_host(e.bytes)?;
                self.dev.offload((&buf, 0), &mut host, e.bytes)?;
                Place::Offloading(host, buf)
            }
            other => other,
        };
        self.states.insert(id.to_string(), Entry { bytes: e.bytes, place });
        Ok(())
    }

    /// Starts moving `id`'s state back to the device; compute issued after
    /// this call sees it.
    pub fn restore(&mut self, id: &str) -> Result<()> {
        let e = self.take(id)?;
        let place = match e.place {
            Place::Host(host) | Place::Offloading(host, _) => {
                // An offload still in flight must land before it is copied back.
                self.dev.wait_copies()?;
                let buf = self.dev.alloc(e.bytes)?;
                self.dev.restore(&host, (&buf, 0), e.bytes)?;
                Place::Restoring(buf, host)
            }
            other => other,
        };
        self.states.insert(id.to_string(), Entry { bytes: e.bytes, place });
        Ok(())
    }

    /// Waits for the issued copies and frees the buffers they replaced.
    pub fn settle(&mut self) -> Result<()> {
        self.dev.wait_copies()?;
        let settling: Vec<String> = self
            .states
            .iter()
            .filter(|(_, e)| matches!(e.place, Place::Offloading(..) | Place::Restoring(..)))
            .map(|(id, _)| id.clone())
            .collect();
        for id in settling {
            let e = self.take(&id)?;
            let place = match e.place {
                Place::Offloading(host, _buf) => Place::Host(host),
                Place::Restoring(buf, _host) => Place::Device(buf),
                other => other,
            };
            self.states.insert(id, Entry { bytes: e.bytes, place });
        }
        Ok(())
    }

    /// Whether `id`'s state is on the device (or on its way there).
    pub fn on_device(&self, id: &str) -> Option<bool> {
        self.states.get(id).map(|e| matches!(e.place, Place::Device(_) | Place::Restoring(..)))
    }

    /// `id`'s exact bytes, wherever they are.
    pub fn read(&mut self, id: &str) -> Result<Vec<u8>> {
        self.settle()?;
        let e = self.states.get(id).ok_or_else(|| DeviceError(format!("no state for session {id}")))?;
        match &e.place {
            Place::Device(buf) => {
                let mut out = vec![0u8; e.bytes];
                self.dev.download(buf, 0, &mut out)?;
                Ok(out)
            }
            Place::Host(host) => Ok(self.dev.host_bytes(host)[..e.bytes].to_vec()),
            _ => Err(DeviceError("copies still in flight after settling".into())),
        }
    }

    /// Forgets `id`'s state (after any copy of it in flight).
    pub fn remove(&mut self, id: &str) -> Result<()> {
        self.retire(id)
    }

    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }
}
