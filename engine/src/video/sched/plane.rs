//! The scheduler's side of the state plane (`crate::video::state`,
//! `crate::video::transfer`): a session's wire form, export and import,
//! and the transfer steps: the source's offer and snapshots, the target's
//! staged copy and commit. Offers expire after `TRANSFER_TTL`; staged
//! copies too, and at most `arena_slots` are kept.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Core, Place, Session, Staged};
use crate::video::model::StreamState;
use crate::video::state::{self, Kv, Meta, Version};
use crate::video::VideoError;

/// How long an offered transfer stays open, and a staged copy is kept.
const TRANSFER_TTL: Duration = Duration::from_secs(60);

impl Core {
    /// The session's wire form: all of it, or the pages rewritten since
    /// `since` (a full copy when `since` is of another prompt or too old).
    fn wire(&self, id: &str, since: Option<Version>) -> Result<Vec<u8>, VideoError> {
        let s = self.sessions.get(id).ok_or_else(|| VideoError::NoSession(id.into()))?;
        let state = match &s.place {
            Place::Resident(st) => st.to_bytes(),
            Place::Suspended(b) => b.clone(),
            Place::Busy => return Err(VideoError::BadState),
        };
        let chunks = StreamState::from_bytes(&state).map_or(0, |st| st.chunks);
        let base = since.filter(|v| v.epoch == s.epoch && v.chunks <= chunks);
        let include = match base {
            Some(v) => s.kv.recent(chunks - v.chunks),
            None => (0..s.kv.pages.len()).collect(),
        };
        let meta = Meta {
            prompt: s.prompt.clone(),
            resolution: s.res,
            latent_frames: s.latent_frames,
            epoch: s.epoch,
            credit: s.credit,
            state_len: None,
            kv_pages: 0,
            kv_page_bytes: 0,
            kv_cursor: 0,
            included: Vec::new(),
            base,
        };
        Ok(state::encode(&meta, &state, &s.kv, &include))
    }

    pub(super) fn export(&mut self, id: &str) -> Result<Vec<u8>, VideoError> {
        let out = self.wire(id, None)?;
        self.sessions.remove(id);
        self.offers.remove(id);
        self.fail_pending(id);
        self.forget_on_gpu(id);
        Ok(out)
    }

    fn session_of(wire: state::Wire, kv: Kv) -> Session {
        Session {
            prompt: wire.meta.prompt,
            res: wire.meta.resolution,
            latent_frames: wire.meta.latent_frames,
            epoch: wire.meta.epoch,
            place: Place::Suspended(wire.state_bytes),
            credit: wire.meta.credit,
            generated: wire.state.chunks,
            recent: VecDeque::new(),
            kv,
        }
    }

    pub(super) fn import(&mut self, id: String, bytes: &[u8]) -> Result<(), VideoError> {
        if self.sessions.contains_key(&id) {
            return Err(VideoError::Exists(id));
        }
        let wire = state::parse(bytes)?;
        if wire.meta.base.is_some() {
            return Err(VideoError::BadState);
        }
        let kv = state::kv_of(&wire);
        self.forget_on_gpu(&id);
        self.sessions.insert(id, Self::session_of(wire, kv));
        Ok(())
    }

    pub(super) fn offer(&mut self, id: String, token: String) -> Result<Version, VideoError> {
        let s = self.sessions.get(&id).ok_or_else(|| VideoError::NoSession(id.clone()))?;
        let chunks = match &s.place {
            Place::Resident(st) => st.chunks,
            Place::Suspended(b) => StreamState::from_bytes(b).map_or(0, |st| st.chunks),
            Place::Busy => 0,
        };
        let version = Version { epoch: s.epoch, chunks };
        let now = crate::clock::now();
        self.offers.retain(|_, (_, until)| *until > now);
        self.offers.insert(id, (token, now + TRANSFER_TTL));
        Ok(version)
    }

    pub(super) fn snapshot(
        &mut self,
        id: &str,
        token: &str,
        since: Option<Version>,
    ) -> Result<Vec<u8>, VideoError> {
        let valid = self.offers.get(id).is_some_and(|(t, until)| {
            *until > crate::clock::now() && crate::api::bearer_matches(t, Some(&format!("Bearer {token}")))
        });
        if !valid {
            return Err(VideoError::NoOffer(id.into()));
        }
        self.wire(id, since)
    }

    /// Keeps a full copy aside. An empty body only reads the staged
    /// version.
    pub(super) fn stage(&mut self, id: String, bytes: &[u8]) -> Result<Version, VideoError> {
        if bytes.is_empty() {
            return self.staged.get(&id).map(|s| s.wire.version()).ok_or(VideoError::NoSession(id));
        }
        if self.sessions.contains_key(&id) {
            return Err(VideoError::Exists(id));
        }
        let wire = state::parse(bytes)?;
        if wire.meta.base.is_some() {
            return Err(VideoError::BadState);
        }
        let now = crate::clock::now();
        self.staged.retain(|_, s| now.duration_since(s.at) < TRANSFER_TTL);
        if self.staged.len() >= self.cfg.arena_slots as usize && !self.staged.contains_key(&id) {
            return Err(VideoError::Busy);
        }
        let version = wire.version();
        let kv = state::kv_of(&wire);
        self.staged.insert(id, Staged { wire, kv, at: now });
        Ok(version)
    }

    /// Applies the last delta to the staged copy and takes the session.
    pub(super) fn commit(&mut self, id: String, delta: &[u8]) -> Result<(), VideoError> {
        if self.sessions.contains_key(&id) {
            return Err(VideoError::Exists(id));
        }
        let wire = state::parse(delta)?;
        let kv = match wire.meta.base {
            None => state::kv_of(&wire), // the source sent everything again
            Some(base) => {
                let staged = self.staged.get_mut(&id).ok_or_else(|| VideoError::NoSession(id.clone()))?;
                if staged.wire.version() != base {
                    return Err(VideoError::BadState);
                }
                let mut kv = std::mem::take(&mut staged.kv);
                state::apply_pages(&mut kv, &wire);
                kv
            }
        };
        self.staged.remove(&id);
        self.forget_on_gpu(&id);
        self.sessions.insert(id, Self::session_of(wire, kv));
        Ok(())
    }

    /// Takes the staged copy as the session, as it is: the source died
    /// before the final delta, so the session goes on from the state it
    /// offloaded at the pre-copy (chunks since are regenerated from there).
    pub(super) fn adopt(&mut self, id: String) -> Result<Version, VideoError> {
        if self.sessions.contains_key(&id) {
            return Err(VideoError::Exists(id));
        }
        let staged = self.staged.remove(&id).ok_or_else(|| VideoError::NoSession(id.clone()))?;
        let version = staged.wire.version();
        self.forget_on_gpu(&id);
        self.sessions.insert(id, Self::session_of(staged.wire, staged.kv));
        Ok(version)
    }
}
