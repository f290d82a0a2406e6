//! Usage and API keys shared through Redis: a day's counters as one hash
//! (`slo:usage:{day}`, fields `tenant`, `key`, `model`, `counter` joined
//! by the unit separator), what this gateway counted added every second,
//! the fleet's totals read back.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Counts, Row, UsageStore, KEEP_DAYS};

/// Redis's field name of a row's counter (`tenant`, `key`, `model`,
/// `counter`, joined by the unit separator: none of them holds one).
pub fn redis_field(row: &Row, counter: &str) -> String {
    format!("{}\u{1f}{}\u{1f}{}\u{1f}{counter}", row.tenant, row.key, row.model)
}

/// The rows of one day's Redis hash (`field -> value`).
pub fn from_redis(day: u32, fields: Vec<(String, u64)>) -> Vec<(Row, Counts)> {
    let mut rows: BTreeMap<Row, Counts> = BTreeMap::new();
    for (field, v) in fields {
        let mut parts = field.split('\u{1f}');
        let (Some(tenant), Some(key), Some(model), Some(counter), None) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let row = Row { day, tenant: tenant.into(), key: key.into(), model: model.into() };
        rows.entry(row).or_default().set(counter, v);
    }
    rows.into_iter().collect()
}

/// A row's counters with their Redis field names.
pub fn to_redis(row: &Row, c: &Counts) -> Vec<(String, u64)> {
    Counts::FIELDS
        .iter()
        .zip(c.values())
        .filter(|(_, v)| *v > 0)
        .map(|(f, v)| (redis_field(row, f), v))
        .collect()
}

/// Writes the keys changed here to Redis and reads the fleet's back (no
/// Redis: nothing to do). Called every second and after each change.
pub async fn sync_keys(app: &crate::App) {
    let Some(redis) = app.cluster.redis.as_ref() else { return };
    if !redis.is_up() {
        app.keys.sync_failed();
        return;
    }
    let as_json = |rs: Vec<crate::keys::KeyRecord>| -> Vec<(String, String)> {
        rs.iter()
            .map(|r| (r.id.clone(), serde_json::to_string(r).expect("a key record serialises")))
            .collect()
    };
    // Where Redis lost them (a restart without persistence): written back
    // only where it has none, never over a change made elsewhere since.
    let resync = as_json(app.keys.take_resync());
    if !resync.is_empty() {
        if let Err(e) = redis.put_keys(&resync, true).await {
            redis.mark_down(&e);
            app.keys.sync_failed();
            return;
        }
    }
    let changed = app.keys.unsynced();
    if !changed.is_empty() {
        let records = as_json(changed);
        match redis.put_keys(&records, false).await {
            Ok(()) => app.keys.synced(&records.into_iter().map(|(id, _)| id).collect::<Vec<_>>()),
            Err(e) => {
                redis.mark_down(&e);
                app.keys.sync_failed();
                return;
            }
        }
    }
    match redis.keys().await {
        Ok(all) => {
            let records = all.iter().filter_map(|j| serde_json::from_str(j).ok()).collect();
            app.keys.merge(records);
        }
        Err(e) => redis.mark_down(&e),
    }
}

/// Adds what was counted here to Redis and reads this month's totals back
/// (no Redis: saves the state file).
pub async fn sync_usage(app: &crate::App) {
    let Some(redis) = &app.cluster.redis else {
        app.usage.save();
        return;
    };
    if !redis.is_up() {
        return; // the counts wait (pending) for Redis to answer again
    }
    let pending = app.usage.take_pending();
    if !pending.is_empty() {
        let mut by_day: BTreeMap<u32, Vec<(String, u64)>> = BTreeMap::new();
        for (row, c) in &pending {
            by_day.entry(row.day).or_default().extend(to_redis(row, c));
        }
        if let Err(e) = redis.add_usage(&by_day.into_iter().collect::<Vec<_>>(), KEEP_DAYS).await {
            redis.mark_down(&e);
            app.usage.unflushed(pending);
            return;
        }
    }
    let days = UsageStore::refresh_days(crate::clock::unix_s() as u64);
    refresh_days(app, &days).await;
}

async fn refresh_days(app: &crate::App, days: &[u32]) {
    let Some(redis) = app.cluster.redis.as_ref().filter(|r| r.is_up()) else { return };
    match redis.usage_days(days).await {
        Ok(per_day) => {
            let rows = per_day.into_iter().flat_map(|(day, fields)| from_redis(day, fields)).collect();
            app.usage.refreshed(days, rows);
        }
        Err(e) => redis.mark_down(&e),
    }
}

/// Before an export of days `from..=to`: with Redis, its totals of those
/// days (this gateway's rows hold only this month's otherwise).
pub async fn refresh_range(app: &crate::App, from: u32, to: u32) {
    let days: Vec<u32> = (from..=to).collect();
    for chunk in days.chunks(31) {
        refresh_days(app, chunk).await;
    }
}

/// Every second: keys and usage with Redis, or the state file.
pub async fn run(app: Arc<crate::App>) {
    let mut ticks = tokio::time::interval(std::time::Duration::from_secs(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        sync_keys(&app).await;
        sync_usage(&app).await;
    }
}
