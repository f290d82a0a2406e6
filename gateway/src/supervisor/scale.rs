//! The autoscaler's decisions applied to the primary class's children:
//! promote, start, take back or drain serving engines, and keep the warm
//! pool at its size.

use std::collections::BTreeMap;
use std::sync::Arc;

use policies::autoscale::{AutoscaleConfig, Decision};

use super::{is_primary, ChildEngine, ChildState, Supervisor};
use crate::engines::{EnginePool, EngineSlot};

type Children = BTreeMap<String, ChildEngine>;

/// The pool's slot of child `id`, once it has registered.
fn role(pool: &EnginePool, id: &str) -> Option<Arc<EngineSlot>> {
    pool.index_of(id).map(|i| pool.slot(i))
}

impl Supervisor {
    /// Moves the primary class toward `d`: promote warm engines first, then
    /// start cold ones; drain the least loaded serving engines to scale in
    /// (into the warm pool while it is short); keep the warm pool at its
    /// size. Also finishes drains whose engines have no work left.
    pub fn apply(self: &Arc<Self>, d: &Decision, cfg: &AutoscaleConfig) {
        self.configure(cfg);
        let Some(pool) = self.pool.get().cloned() else { return };
        self.finish_drains(&pool);
        let mut to_spawn = Vec::new();
        let stop = {
            let mut children = self.lock();
            let have = self.scale_out(&mut children, &pool, d, cfg, &mut to_spawn);
            scale_in(&mut children, &pool, have, d, &self.holds(&pool));
            self.keep_warm_pool(&mut children, &pool, d, cfg, &mut to_spawn)
        };
        for id in stop {
            self.stop_child(&id, &pool);
        }
        for id in to_spawn {
            self.spawn_detached(id);
        }
    }

    /// A new child in `state`, if the fleet's bound has room.
    fn add_child(&self, children: &mut Children, cfg: &AutoscaleConfig, state: ChildState) -> Option<String> {
        if children.len() >= cfg.max_engines as usize + self.overflow_count() {
            return None;
        }
        let id = self.next_id();
        children.insert(id.clone(), ChildEngine::new(&id, self.launch.profile.clone(), state));
        Some(id)
    }

    /// Scale out: warm -> serving, starting-warm -> serving, take back a
    /// draining engine, then a cold start. Returns how many serve (or will).
    fn scale_out(
        &self,
        children: &mut Children,
        pool: &EnginePool,
        d: &Decision,
        cfg: &AutoscaleConfig,
        to_spawn: &mut Vec<String>,
    ) -> usize {
        let mut have = children
            .values()
            .filter(|c| is_primary(&c.id))
            .filter(|c| match c.state {
                ChildState::Running => role(pool, &c.id).is_some_and(|s| !s.is_standby()),
                ChildState::Starting { warm } => !warm,
                _ => false,
            })
            .count();
        while have < d.serving as usize {
            let warm = children.values_mut().find(|c| {
                is_primary(&c.id)
                    && c.state == ChildState::Running
                    && role(pool, &c.id).is_some_and(|s| s.is_standby())
            });
            if let Some(c) = warm {
                if let Some(s) = role(pool, &c.id) {
                    s.set_standby(false);
                }
                tracing::info!(event = "engine_promoted", engine = %c.id, why = d.why.label());
            } else if let Some(c) = children
                .values_mut()
                .find(|c| is_primary(&c.id) && c.state == ChildState::Starting { warm: true })
            {
                c.state = ChildState::Starting { warm: false };
            } else if let Some(c) = children
                .values_mut()
                .find(|c| is_primary(&c.id) && matches!(c.state, ChildState::Draining { .. }))
            {
                c.state = ChildState::Running;
                if let Some(s) = role(pool, &c.id) {
                    s.set_draining(false);
                    s.set_standby(false);
                }
            } else if let Some(id) = self.add_child(children, cfg, ChildState::Starting { warm: false }) {
                to_spawn.push(id);
            } else {
                break;
            }
            have += 1;
        }
        have
    }

    /// The warm pool: drains join it first, then starts; extra warm engines
    /// are returned to be stopped.
    fn keep_warm_pool(
        &self,
        children: &mut Children,
        pool: &EnginePool,
        d: &Decision,
        cfg: &AutoscaleConfig,
        to_spawn: &mut Vec<String>,
    ) -> Vec<String> {
        let mut pool_n = children
            .values()
            .filter(|c| is_primary(&c.id))
            .filter(|c| match c.state {
                ChildState::Running => role(pool, &c.id).is_some_and(|s| s.is_standby()),
                ChildState::Starting { warm } => warm,
                ChildState::Draining { to_warm } => to_warm,
                ChildState::Restarting => false,
            })
            .count();
        let warm_want = d.warm as usize;
        for c in children.values_mut().filter(|c| is_primary(&c.id)) {
            if pool_n >= warm_want {
                break;
            }
            if c.state == (ChildState::Draining { to_warm: false }) {
                c.state = ChildState::Draining { to_warm: true };
                pool_n += 1;
            }
        }
        while pool_n < warm_want {
            let Some(id) = self.add_child(children, cfg, ChildState::Starting { warm: true }) else { break };
            to_spawn.push(id);
            pool_n += 1;
        }
        let extra = pool_n.saturating_sub(warm_want);
        children
            .values()
            .filter(|c| is_primary(&c.id) && c.state == ChildState::Running)
            .filter(|c| role(pool, &c.id).is_some_and(|s| s.is_standby()))
            .map(|c| c.id.clone())
            .take(extra)
            .collect()
    }
}

/// Scale in: drain the least loaded serving engines down to `d.serving`:
/// those holding the fewest live video streams (each must be moved off
/// before the engine stops), then the fewest sequences.
fn scale_in(children: &mut Children, pool: &EnginePool, mut have: usize, d: &Decision, holds: &[u32]) {
    while have > d.serving as usize {
        let victim = children
            .values_mut()
            .filter(|c| is_primary(&c.id) && c.state == ChildState::Running)
            .filter_map(|c| {
                let i = pool.index_of(&c.id)?;
                let s = pool.slot(i);
                (!s.is_standby()).then(|| ((holds.get(i).copied().unwrap_or(0), s.active()), c))
            })
            .min_by_key(|(load, _)| *load)
            .map(|(_, c)| c);
        let Some(c) = victim else { break };
        c.state = ChildState::Draining { to_warm: false };
        if let Some(s) = role(pool, &c.id) {
            s.set_draining(true);
        }
        tracing::info!(event = "engine_draining", engine = %c.id, why = d.why.label());
        have -= 1;
    }
}
