//! The state arena's residents: which sessions hold a slot on the device
//! (or in the cpu backend's arena), suspending the highest-credit one
//! outside the batch to host memory when a slot is needed, and resuming a
//! suspended session when its chunk runs.

use super::{Core, Place, Session};
use crate::video::model::StreamState;
use crate::video::VideoError;

impl Core {
    /// The session's state was replaced or left: the GPU's device copy of
    /// it (cuda backend) is stale.
    pub(super) fn forget_on_gpu(&self, id: &str) {
        if let Some(gpu) = &self.cfg.gpu {
            gpu.forget(id);
        }
    }

    pub(super) fn resident(&self) -> u32 {
        self.sessions.values().filter(|s| !matches!(s.place, Place::Suspended(_))).count() as u32
    }

    /// Frees one arena slot by suspending the highest-credit resident not in
    /// `busy`; false when none can go.
    pub(super) fn evict(&mut self, keep: &[String]) -> bool {
        let residents: Vec<(u64, f64, String)> = self
            .sessions
            .iter()
            .filter(|(id, s)| matches!(s.place, Place::Resident(_)) && !keep.contains(id))
            .enumerate()
            .map(|(i, (id, s))| (i as u64, s.credit, id.clone()))
            .collect();
        let pairs: Vec<(u64, f64)> = residents.iter().map(|(i, c, _)| (*i, *c)).collect();
        let Some(victim) = policies::video::placement::evict(&pairs) else { return false };
        let id = residents[victim as usize].2.clone();
        tracing::debug!(event = "video_evict", session = %id);
        self.suspend(&id).is_ok()
    }

    pub(super) fn suspend(&mut self, id: &str) -> Result<(), VideoError> {
        let s = self.sessions.get_mut(id).ok_or_else(|| VideoError::NoSession(id.into()))?;
        if let Place::Resident(state) = &s.place {
            s.place = Place::Suspended(state.to_bytes());
            if let Some(gpu) = &self.cfg.gpu {
                gpu.offload(id);
            }
            self.load.suspends += 1;
            ::metrics::counter!(crate::metrics::VIDEO_SUSPENDS).increment(1);
        }
        Ok(())
    }

    pub(super) fn resume(&mut self, id: &str, keep: &[String]) -> Result<bool, VideoError> {
        let suspended = match self.sessions.get(id) {
            None => return Err(VideoError::NoSession(id.into())),
            Some(s) => matches!(s.place, Place::Suspended(_)),
        };
        if !suspended {
            return Ok(true);
        }
        if self.resident() >= self.cfg.arena_slots && !self.evict(keep) {
            return Ok(false);
        }
        let s = self.sessions.get_mut(id).expect("checked above");
        if let Place::Suspended(bytes) = &s.place {
            let state = StreamState::from_bytes(bytes).ok_or(VideoError::BadState)?;
            s.place = Place::Resident(state);
            if let Some(gpu) = &self.cfg.gpu {
                gpu.restore(id);
            }
            self.load.resumes += 1;
        }
        Ok(true)
    }

    /// Inserts a session, making room in the arena or starting it suspended.
    pub(super) fn insert(&mut self, id: String, mut session: Session) {
        if matches!(session.place, Place::Resident(_))
            && self.resident() >= self.cfg.arena_slots
            && !self.evict(&[])
        {
            if let Place::Resident(st) = &session.place {
                session.place = Place::Suspended(st.to_bytes());
            }
        }
        self.sessions.insert(id, session);
    }
}
