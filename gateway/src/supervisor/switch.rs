//! The supervisor's side of OServe's deployment switches (issue 25,
//! `crate::oserve`): which classes the children run, a drain of one engine
//! of a class, a start with a configuration's profile and flags, and
//! finishing drains for a fleet the autoscaler does not drive.

use std::path::PathBuf;
use std::sync::Arc;

use super::{ChildEngine, ChildState, Supervisor};

impl Supervisor {
    /// The engine class of every child not stopped (from its running
    /// engine's profile; `None` while it starts or restarts), and whether
    /// any is starting or draining (a switch step in progress).
    pub fn child_classes(&self) -> (Vec<Option<String>>, bool) {
        let pool = self.pool.get();
        let children = self.lock();
        let busy = children
            .values()
            .any(|c| matches!(c.state, ChildState::Starting { .. } | ChildState::Draining { .. }));
        let classes = children
            .values()
            .map(|c| {
                let slot = pool.and_then(|p| p.index_of(&c.id).map(|i| p.slot(i)));
                slot.and_then(|s| s.profile()).map(|p| p.engine_class.clone())
            })
            .collect();
        (classes, busy)
    }

    /// Starts a new primary engine with `profile` and its own flags `args`
    /// (a deployment switch's start step); it serves once ready.
    pub fn start_with_profile(self: &Arc<Self>, profile: PathBuf, args: Vec<String>) {
        let id = self.next_id();
        let mut child = ChildEngine::new(&id, Some(profile), ChildState::Starting { warm: false });
        child.args = args;
        self.lock().insert(id.clone(), child);
        tracing::info!(event = "engine_switch_start", engine = %id);
        self.spawn_detached(id);
    }

    /// Drains the least loaded serving engine of engine class `class` (a
    /// deployment switch's drain step): no new work, it stops once its
    /// sequences finish ([`Supervisor::finish_drains_now`]). False when
    /// none serves.
    pub fn drain_class(&self, class: &str) -> bool {
        let Some(pool) = self.pool.get() else { return false };
        let mut children = self.lock();
        let victim = children
            .values_mut()
            .filter(|c| c.state == ChildState::Running)
            .filter_map(|c| {
                let slot = pool.index_of(&c.id).map(|i| pool.slot(i))?;
                let ours = !slot.is_standby() && slot.profile().is_some_and(|p| p.engine_class == class);
                ours.then(|| (slot.active(), c))
            })
            .min_by_key(|(active, _)| *active)
            .map(|(_, c)| c);
        let Some(c) = victim else { return false };
        c.state = ChildState::Draining { to_warm: false };
        if let Some(i) = pool.index_of(&c.id) {
            pool.slot(i).set_draining(true);
        }
        tracing::info!(event = "engine_draining", engine = %c.id, why = "oserve_switch");
        true
    }

    /// Stops draining engines that have no work left (what `apply` does
    /// each tick, for a fleet the autoscaler does not drive).
    pub fn finish_drains_now(self: &Arc<Self>) {
        if let Some(pool) = self.pool.get().cloned() {
            self.finish_drains(&pool);
        }
    }
}

/// The launch's engine flags with `own` over them: a launch flag whose name
/// `own` also sets is dropped (with its separate value, `--name value`), as
/// the engine refuses a flag given twice.
pub(super) fn merge_args(launch: &[String], own: &[String]) -> Vec<String> {
    let name = |a: &str| a.split_once('=').map_or(a, |(n, _)| n).to_string();
    let overridden: Vec<String> = own.iter().map(|a| name(a)).collect();
    let mut out = Vec::with_capacity(launch.len() + own.len());
    let mut skip_value = false;
    for a in launch {
        if std::mem::take(&mut skip_value) && !a.starts_with("--") {
            continue;
        }
        if a.starts_with("--") && overridden.contains(&name(a)) {
            skip_value = !a.contains('=');
            continue;
        }
        out.push(a.clone());
    }
    out.extend(own.iter().cloned());
    out
}

#[cfg(test)]
mod tests {
    use super::merge_args;

    fn v(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn a_configurations_flags_replace_the_launchs_of_the_same_name() {
        let launch = v(&["--kv-pages=70000", "--max-batch", "256", "--emulated-to-max-tokens"]);
        assert_eq!(
            merge_args(&launch, &v(&["--kv-pages=20000", "--max-batch=64"])),
            v(&["--emulated-to-max-tokens", "--kv-pages=20000", "--max-batch=64"]),
        );
        assert_eq!(merge_args(&launch, &[]), launch, "no flags of its own: the launch's");
    }
}
