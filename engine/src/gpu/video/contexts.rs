//! Sessions' contexts on the device between chunks.
//!
//! Each session's full context (sink, then up to [`MAX_WINDOW`] chunks,
//! oldest first) lives in a [`StateStore`] on the device or offloaded to
//! pinned host memory, tagged with the state it belongs to (prompt seed,
//! chunks generated). A batch uses a resident context instead of uploading
//! it and leaves the updated one behind; a tag that does not match the host
//! state (a prompt switch, an import) means the host state is uploaded
//! again. Members without a session get a context for the batch only.

use std::collections::HashMap;
use std::sync::Arc;

use kernels::video::CHANNELS;
use kernels::{f32_bytes, Device, DeviceError, Result};

use super::BatchItem;
use crate::gpu::offload::StateStore;
use crate::models::video::MAX_WINDOW;

/// How batches found their contexts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContextStats {
    /// Contexts found in device memory (including those whose restore the
    /// scheduler issued when it resumed the session).
    pub resident: u64,
    /// Restores issued from pinned memory (by a resume, or by a batch that
    /// found the context offloaded).
    pub restored: u64,
    /// Contexts uploaded from the host state.
    pub uploaded: u64,
    /// Contexts moved to pinned memory.
    pub offloaded: u64,
}

pub(super) struct Contexts<D: Device> {
    store: StateStore<D>,
    tags: HashMap<String, (u64, u64)>,
    pub(super) stats: ContextStats,
}

/// The store key of member `i`: its session, or a batch-only key (NUL
/// cannot start a session id).
pub(super) fn key(it: &BatchItem<'_>, i: usize) -> String {
    it.session.map_or_else(|| format!("\0batch-{i}"), str::to_string)
}

impl<D: Device> Contexts<D> {
    pub(super) fn new(dev: Arc<D>) -> Self {
        Self { store: StateStore::new(dev), tags: HashMap::new(), stats: ContextStats::default() }
    }

    /// Starts moving `session`'s context to pinned host memory.
    pub(super) fn offload(&mut self, session: &str) -> Result<()> {
        if self.store.device_buf(session).is_some() {
            self.store.offload(session)?;
            self.stats.offloaded += 1;
        }
        Ok(())
    }

    /// Starts bringing `session`'s context back.
    pub(super) fn restore(&mut self, session: &str) -> Result<()> {
        if self.store.on_device(session) == Some(false) {
            self.store.restore(session)?;
            self.stats.restored += 1;
        }
        Ok(())
    }

    /// Drops `session`'s context.
    pub(super) fn forget(&mut self, session: &str) -> Result<()> {
        self.tags.remove(session);
        self.store.remove(session)
    }

    pub(super) fn on_device(&self, session: &str) -> Option<bool> {
        self.store.on_device(session)
    }

    /// The device buffer of `key`'s context (after [`Contexts::locate`]).
    pub(super) fn buf(&self, key: &str) -> Result<&D::Buf> {
        self.store
            .device_buf(key)
            .ok_or_else(|| DeviceError(format!("the context of {key:?} is not on the device")))
    }

    /// Makes the member's full context available on the device under
    /// `key`: resident (nothing to do), offloaded (restore issued), or
    /// uploaded from the host state.
    pub(super) fn locate(&mut self, it: &BatchItem<'_>, key: &str) -> Result<()> {
        let tag = (it.state.seed, it.state.chunks);
        match (self.tags.get(key) == Some(&tag), self.store.on_device(key)) {
            (true, Some(true)) => self.stats.resident += 1,
            (true, Some(false)) => {
                self.store.restore(key)?;
                self.stats.restored += 1;
            }
            _ => {
                let mut bytes = Vec::new();
                for c in it.state.sink.iter().chain(&it.state.window) {
                    bytes.extend_from_slice(&f32_bytes(c));
                }
                self.store.put(key, &bytes)?;
                self.tags.insert(key.to_string(), tag);
                self.stats.uploaded += 1;
            }
        }
        Ok(())
    }

    /// Replaces `key`'s context by the one after this chunk: the sink (or
    /// the new chunk, for a first chunk), the window without its oldest
    /// chunk when full, then the new chunk (`n` tokens at `latent`).
    pub(super) fn advance(
        &mut self,
        dev: &D,
        key: &str,
        it: &BatchItem<'_>,
        latent: (&D::Buf, usize),
        n: usize,
    ) -> Result<()> {
        let chunk = n * CHANNELS * 4;
        let old = self.buf(key)?;
        let has_sink = it.state.sink.is_some();
        let window = it.state.window.len();
        let drop = usize::from(window == MAX_WINDOW);
        let kept = window - drop;
        let next = dev.alloc((2 + kept) * chunk)?;
        dev.copy(if has_sink { (old, 0) } else { latent }, (&next, 0), chunk)?;
        if kept > 0 {
            dev.copy((old, (usize::from(has_sink) + drop) * chunk), (&next, chunk), kept * chunk)?;
        }
        dev.copy(latent, (&next, (1 + kept) * chunk), chunk)?;
        self.store.put_buf(key, next, (2 + kept) * chunk)?;
        self.tags.insert(key.to_string(), (it.state.seed, it.state.chunks + 1));
        Ok(())
    }

    /// After a batch (whatever its outcome): drops the batch-only
    /// contexts, waits for the copies in flight and frees what they
    /// replaced.
    pub(super) fn end_batch(&mut self, items: &[BatchItem<'_>], keys: &[String]) -> Result<()> {
        for (it, key) in items.iter().zip(keys) {
            if it.session.is_none() {
                self.forget(key)?;
            }
        }
        self.store.settle()
    }
}
