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
//!
//! Page-locking host memory and releasing it cost far more than the copy
//! itself (on an H200, allocating 512 MiB pinned held offloads to 2.2 GB/s),
//! so the pinned buffers that restores and removals leave behind are kept
//! for the next offload, up to [`SPARE_PINNED_BYTES`] (`spare_limit`).

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

/// Most bytes of idle pinned buffers a store keeps for reuse.
pub const SPARE_PINNED_BYTES: usize = 1 << 30;

/// Session states on a device, offloadable to pinned host memory.
pub struct StateStore<D: Device> {
    dev: Arc<D>,
    states: HashMap<String, Entry<D>>,
    /// Idle pinned buffers, at most `spare_limit` bytes together.
    spare: Vec<D::Host>,
    spare_limit: usize,
    /// Pinned buffers allocated so far (reuse keeps this flat).
    pub pinned_allocs: u64,
}

impl<D: Device> StateStore<D> {
    pub fn new(dev: Arc<D>) -> Self {
        Self::with_spare_limit(dev, SPARE_PINNED_BYTES)
    }

    /// A store keeping at most `spare_limit` bytes of idle pinned buffers.
    pub fn with_spare_limit(dev: Arc<D>, spare_limit: usize) -> Self {
        Self { dev, states: HashMap::new(), spare: Vec::new(), spare_limit, pinned_allocs: 0 }
    }

    /// Bytes of idle pinned buffers kept.
    pub fn spare_bytes(&self) -> usize {
        self.spare.iter().map(|h| self.dev.host_bytes(h).len()).sum()
    }

    /// A pinned buffer of at least `bytes`: the smallest idle one that
    /// fits, else a new one.
    fn pinned(&mut self, bytes: usize) -> Result<D::Host> {
        let dev = &self.dev;
        let fit = (self.spare.iter().enumerate())
            .filter(|(_, h)| dev.host_bytes(h).len() >= bytes)
            .min_by_key(|(_, h)| dev.host_bytes(h).len())
            .map(|(i, _)| i);
        if let Some(i) = fit {
            return Ok(self.spare.swap_remove(i));
        }
        self.pinned_allocs += 1;
        self.dev.alloc_host(bytes)
    }

    /// Keeps an idle pinned buffer for reuse if the bound allows (it is
    /// freed otherwise). Its copies must have landed.
    fn keep(&mut self, host: D::Host) {
        if self.spare_bytes() + self.dev.host_bytes(&host).len() <= self.spare_limit {
            self.spare.push(host);
        }
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
        if let Some(e) = self.states.remove(id) {
            match e.place {
                Place::Host(h) | Place::Offloading(h, _) | Place::Restoring(_, h) => self.keep(h),
                Place::Device(_) => {}
            }
        }
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
            // The restore's pinned source is reused below: let it land first.
            self.dev.wait_copies()?;
        }
        let e = self.take(id)?;
        let buf = match e.place {
            Place::Device(buf) => buf,
            Place::Restoring(buf, old) => {
                self.keep(old);
                buf
            }
            other => {
                self.states.insert(id.to_string(), Entry { bytes: e.bytes, place: other });
                return Ok(());
            }
        };
        let copied = self
            .pinned(e.bytes)
            .and_then(|mut host| self.dev.offload((&buf, 0), &mut host, e.bytes).map(|()| host));
        // On an error the state stays on the device.
        let (place, result) = match copied {
            Ok(host) => (Place::Offloading(host, buf), Ok(())),
            Err(err) => (Place::Device(buf), Err(err)),
        };
        self.states.insert(id.to_string(), Entry { bytes: e.bytes, place });
        result
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
                Place::Restoring(buf, host) => {
                    self.keep(host);
                    Place::Device(buf)
                }
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
