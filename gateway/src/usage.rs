//! Usage and spend: requests, prompt and completion tokens and their cost
//! (`[cost.tokens]` prices) per tenant, API key, model and UTC day; the
//! budgets of tenants and keys checked against them; the export
//! (`GET /admin/usage`).
//!
//! What is counted: the usage the client saw, once, when the response ends
//! ([`Meter`], held by the request's permit): a finished generation counts
//! the engine's usage; a stream the client left or that failed mid-way
//! counts the prompt and the tokens already relayed; a request that failed
//! before any token reached the client counts nothing. Retries before the
//! first byte are invisible to the client and counted once.
//!
//! Where it lives: with Redis (a fleet), in Redis hashes (one per day,
//! `slo:usage:{day}`), each gateway adding what it counted every second
//! (`HINCRBY`) and reading the month's totals back; while Redis is down
//! the counts wait here (bounded, [`MAX_PENDING_ROWS`]) and are added when
//! it answers again, so nothing is lost or counted twice. Without Redis,
//! here, saved every second and at shutdown to the state directory's
//! `usage.json`, so a restart keeps them (a crash loses at most the last
//! second). Rows older than [`KEEP_DAYS`] are dropped.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use policies::{Budget, PolicyDocument};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// Days of usage kept.
pub const KEEP_DAYS: u32 = 400;
/// Distinct rows waiting for Redis at most (beyond, new counts are kept
/// here only and logged: a bound on an outage's memory).
pub const MAX_PENDING_ROWS: usize = 100_000;
/// Most rows kept in all (a bound on memory; the oldest days go first).
pub const MAX_ROWS: usize = 1_000_000;
/// The `key` of usage through a policy document's key.
pub const POLICY_KEY: &str = "-";

/// One row: a UTC day (days since 1970-01-01), a tenant, a key id
/// ([`POLICY_KEY`] for the policy's keys) and a model.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Row {
    pub day: u32,
    pub tenant: String,
    pub key: String,
    pub model: String,
}

/// What a row counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Counts {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
    /// Millionths of a dollar.
    pub cost_micro_usd: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.requests += o.requests;
        self.prompt_tokens += o.prompt_tokens;
        self.completion_tokens += o.completion_tokens;
        self.cached_tokens += o.cached_tokens;
        self.cost_micro_usd += o.cost_micro_usd;
    }

    fn tokens(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }

    /// The counters by name (the Redis fields' suffixes, the export's keys).
    pub const FIELDS: [&'static str; 5] =
        ["requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_micro_usd"];

    fn values(&self) -> [u64; 5] {
        [self.requests, self.prompt_tokens, self.completion_tokens, self.cached_tokens, self.cost_micro_usd]
    }

    fn set(&mut self, field: &str, v: u64) {
        match field {
            "requests" => self.requests = v,
            "prompt_tokens" => self.prompt_tokens = v,
            "completion_tokens" => self.completion_tokens = v,
            "cached_tokens" => self.cached_tokens = v,
            "cost_micro_usd" => self.cost_micro_usd = v,
            _ => {}
        }
    }
}

/// The usage store.
#[derive(Debug, Default)]
pub struct UsageStore {
    /// Every row known here: with Redis, its totals as last read plus what
    /// is pending.
    rows: Mutex<BTreeMap<Row, Counts>>,
    /// Counted here, not yet added in Redis.
    pending: Mutex<HashMap<Row, Counts>>,
    /// Whether Redis holds the totals (else this store does).
    clustered: AtomicBool,
    file: Option<PathBuf>,
    dirty: AtomicBool,
}

/// The day (days since 1970-01-01, UTC) of unix second `s`.
pub fn day_of(s: u64) -> u32 {
    (s / 86_400) as u32
}

/// The first day of the month of `day`, and of the next month.
fn month_bounds(day: u32) -> (u32, u32) {
    let (y, m, _) = crate::audit::civil_from_days(i64::from(day));
    let first = days_from_civil(y, m, 1);
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    (first, days_from_civil(ny, nm, 1))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> u32 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe - 719_468).max(0) as u32
}

/// `YYYY-MM-DD` of a day.
pub fn day_string(day: u32) -> String {
    let (y, m, d) = crate::audit::civil_from_days(i64::from(day));
    format!("{y:04}-{m:02}-{d:02}")
}

/// The day of `YYYY-MM-DD`.
pub fn parse_day(s: &str) -> Option<u32> {
    let mut it = s.splitn(3, '-');
    let y: i64 = it.next()?.parse().ok()?;
    let m: u32 = it.next()?.parse().ok()?;
    let d: u32 = it.next()?.parse().ok()?;
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let day = days_from_civil(y, m, d);
    (day_string(day) == s).then_some(day) // no 31 February
}

/// What a budget has been spent on, over the current day and month.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Spent {
    day_tokens: u64,
    month_tokens: u64,
    month_usd: f64,
}

impl UsageStore {
    /// The store, loaded from `file` (the state directory's `usage.json`)
    /// when it exists.
    pub fn open(file: Option<PathBuf>) -> Self {
        let store = Self { file, ..Self::default() };
        if let Some(path) = &store.file {
            match std::fs::read(path) {
                Ok(bytes) => match serde_json::from_slice::<Vec<(Row, Counts)>>(&bytes) {
                    Ok(rows) => {
                        *store.rows.lock().unwrap_or_else(|e| e.into_inner()) = rows.into_iter().collect()
                    }
                    Err(e) => {
                        tracing::error!(event = "usage_file_unreadable", path = %path.display(), error = %e)
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::error!(event = "usage_file_unreadable", path = %path.display(), error = %e)
                }
            }
        }
        store
    }

    /// From now on Redis holds the totals (this store forwards its counts).
    pub fn set_clustered(&self) {
        self.clustered.store(true, Ordering::Relaxed);
    }

    /// Counts one response's usage.
    pub fn record(&self, row: Row, counts: Counts) {
        let c = crate::metrics::usage(&row.tenant, &row.model);
        c.requests.increment(counts.requests);
        c.prompt.increment(counts.prompt_tokens);
        c.completion.increment(counts.completion_tokens);
        c.cost.increment(counts.cost_micro_usd);
        if self.clustered.load(Ordering::Relaxed) {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if pending.len() < MAX_PENDING_ROWS || pending.contains_key(&row) {
                pending.entry(row.clone()).or_default().add(&counts);
            } else {
                tracing::error!(event = "usage_pending_full", rows = pending.len());
            }
        }
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        rows.entry(row).or_default().add(&counts);
        if rows.len() > MAX_ROWS {
            let oldest = rows.keys().next().map(|r| r.day).unwrap_or(0);
            rows.retain(|r, _| r.day > oldest);
        }
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// What the tenant (or, with `key`, that key) spent this day and month.
    fn spent(&self, tenant: &str, key: Option<&str>, today: u32) -> Spent {
        let (first, _) = month_bounds(today);
        let rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        let mut s = Spent::default();
        let from = Row { day: first, tenant: String::new(), key: String::new(), model: String::new() };
        for (r, c) in rows.range(from..) {
            if r.tenant != tenant || key.is_some_and(|k| r.key != k) {
                continue;
            }
            s.month_tokens += c.tokens();
            s.month_usd += c.cost_micro_usd as f64 / 1e6;
            if r.day == today {
                s.day_tokens += c.tokens();
            }
        }
        s
    }

    /// `Err(budget_exceeded)` when the tenant's budget or its key's is
    /// spent (checked before any engine work); else the token budget with
    /// the least left, if any (the rate-limit headers' tokens).
    pub fn check(
        &self,
        tenant: &policies::Tenant,
        key: Option<&crate::keys::KeyRecord>,
        now_s: u64,
    ) -> Result<Option<crate::ratelimit::Window>, ApiError> {
        let today = day_of(now_s);
        let (_, next_month) = month_bounds(today);
        let until = |day: u32| (u64::from(day) * 86_400).saturating_sub(now_s);
        let mut budgets = vec![("tenant", &tenant.budget, None)];
        if let Some(k) = key {
            budgets.push(("key", &k.budget, Some(k.id.as_str())));
        }
        let mut tightest: Option<crate::ratelimit::Window> = None;
        for (whose, budget, key) in budgets {
            if !budget.is_set() {
                continue;
            }
            let s = self.spent(&tenant.name, key, today);
            if let Some((what, limit)) = exceeded(budget, &s) {
                let resets = if what == "tokens_per_day" { today + 1 } else { next_month };
                return Err(ApiError::BudgetExceeded {
                    budget: format!("{whose} {what}"),
                    limit,
                    resets: day_string(resets),
                    retry_after_s: u32::try_from(until(resets)).unwrap_or(u32::MAX),
                });
            }
            let windows = [
                budget.tokens_per_day.map(|l| (l, s.day_tokens, until(today + 1))),
                budget.tokens_per_month.map(|l| (l, s.month_tokens, until(next_month))),
            ];
            for (limit, used, reset_s) in windows.into_iter().flatten() {
                let w = crate::ratelimit::Window { limit, used, reset_s };
                if tightest.is_none_or(|t| w.limit.saturating_sub(w.used) < t.limit.saturating_sub(t.used)) {
                    tightest = Some(w);
                }
            }
        }
        Ok(tightest)
    }

    /// The rows of days `from..=to`, summed by the `group_by` dimensions
    /// (`key`, `tenant`, `model`, `day`), in order.
    pub fn report(&self, from: u32, to: u32, group_by: &[Dimension]) -> Vec<(Vec<String>, Counts)> {
        let rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: BTreeMap<Vec<String>, Counts> = BTreeMap::new();
        let start = Row { day: from, tenant: String::new(), key: String::new(), model: String::new() };
        for (r, c) in rows.range(start..).take_while(|(r, _)| r.day <= to) {
            let group = group_by.iter().map(|d| d.of(r)).collect();
            out.entry(group).or_default().add(c);
        }
        out.into_iter().collect()
    }

    /// Saves the rows to the state file if they changed (one gateway).
    pub fn save(&self) {
        let Some(path) = &self.file else { return };
        if !self.dirty.swap(false, Ordering::Relaxed) {
            return;
        }
        let today = day_of(crate::clock::unix_s() as u64);
        let rows: Vec<(Row, Counts)> = {
            let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
            rows.retain(|r, _| r.day + KEEP_DAYS > today);
            rows.iter().map(|(r, c)| (r.clone(), *c)).collect()
        };
        let bytes = serde_json::to_vec(&rows).expect("usage rows serialise");
        if let Err(e) = crate::keys::write_state(path, &bytes) {
            self.dirty.store(true, Ordering::Relaxed);
            tracing::error!(event = "usage_file_write_failed", path = %path.display(), error = %e);
        }
    }

    /// The counts waiting for Redis, taken (put them back with
    /// [`Self::unflushed`] if Redis does not take them).
    pub fn take_pending(&self) -> HashMap<Row, Counts> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Counts Redis did not take: pending again, added to what came since.
    pub fn unflushed(&self, back: HashMap<Row, Counts>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (row, c) in back {
            pending.entry(row).or_default().add(&c);
        }
    }

    /// Redis's totals for `days`: they replace this store's rows of those
    /// days, plus what is still pending here.
    pub fn refreshed(&self, days: &[u32], totals: Vec<(Row, Counts)>) {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        rows.retain(|r, _| !days.contains(&r.day));
        for (row, c) in totals {
            rows.entry(row).or_default().add(&c);
        }
        for (row, c) in pending.into_iter().filter(|(r, _)| days.contains(&r.day)) {
            rows.entry(row).or_default().add(&c);
        }
    }

    /// The days a refresh reads: this month's, up to today.
    pub fn refresh_days(now_s: u64) -> Vec<u32> {
        let today = day_of(now_s);
        let (first, _) = month_bounds(today);
        (first..=today).collect()
    }
}

/// The first budget `spent` is past, with its limit.
fn exceeded(b: &Budget, s: &Spent) -> Option<(&'static str, String)> {
    if let Some(l) = b.tokens_per_day.filter(|l| s.day_tokens >= *l) {
        return Some(("tokens_per_day", l.to_string()));
    }
    if let Some(l) = b.tokens_per_month.filter(|l| s.month_tokens >= *l) {
        return Some(("tokens_per_month", l.to_string()));
    }
    if let Some(l) = b.usd_per_month.filter(|l| s.month_usd >= *l) {
        return Some(("usd_per_month", format!("${l}")));
    }
    None
}

/// A dimension of the usage export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimension {
    Key,
    Tenant,
    Model,
    Day,
}

impl Dimension {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "key" => Dimension::Key,
            "tenant" => Dimension::Tenant,
            "model" => Dimension::Model,
            "day" => Dimension::Day,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Dimension::Key => "key",
            Dimension::Tenant => "tenant",
            Dimension::Model => "model",
            Dimension::Day => "day",
        }
    }

    fn of(self, r: &Row) -> String {
        match self {
            Dimension::Key => r.key.clone(),
            Dimension::Tenant => r.tenant.clone(),
            Dimension::Model => r.model.clone(),
            Dimension::Day => day_string(r.day),
        }
    }
}

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

/// One response's usage, counted when it ends (held by its permit).
#[derive(Debug)]
pub struct Meter {
    pub store: Arc<UsageStore>,
    pub tenant: String,
    pub key: String,
    pub model: String,
    /// The prompt's tokens as the gateway counted them (a stream that ends
    /// early counts these).
    pub prompt_tokens: u32,
    /// Tokens reach the client as they come (else only at the end).
    pub streaming: bool,
    seen: u32,
    done: bool,
}

impl Meter {
    pub fn new(
        store: Arc<UsageStore>,
        (tenant, key, model): (&str, &str, &str),
        prompt_tokens: u32,
        streaming: bool,
    ) -> Self {
        Self {
            store,
            tenant: tenant.into(),
            key: key.into(),
            model: model.into(),
            prompt_tokens,
            streaming,
            seen: 0,
            done: false,
        }
    }

    /// A token reached the client's stream.
    pub fn token(&mut self) {
        if self.streaming {
            self.seen += 1;
        }
    }

    fn count(&self, policy: &PolicyDocument, prompt: u32, completion: u32, cached: u32) {
        let cost = policy.cost.token_cost(&self.model, u64::from(prompt), u64::from(completion));
        let counts = Counts {
            requests: 1,
            prompt_tokens: u64::from(prompt),
            completion_tokens: u64::from(completion),
            cached_tokens: u64::from(cached),
            cost_micro_usd: (cost * 1e6).round() as u64,
        };
        let day = day_of(crate::clock::unix_s() as u64);
        let row = Row { day, tenant: self.tenant.clone(), key: self.key.clone(), model: self.model.clone() };
        self.store.record(row, counts);
    }

    /// The generation ended: the engine's usage, as the client got it.
    pub fn finished(&mut self, policy: &PolicyDocument, usage: engine_api::Usage) {
        if !std::mem::replace(&mut self.done, true) {
            self.count(policy, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens);
        }
    }

    /// The response ended without finishing: what the client saw of it.
    pub fn ended(&mut self, policy: &PolicyDocument) {
        if !std::mem::replace(&mut self.done, true) && self.seen > 0 {
            self.count(policy, self.prompt_tokens, self.seen, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(day: u32, tenant: &str, key: &str) -> Row {
        Row { day, tenant: tenant.into(), key: key.into(), model: "m".into() }
    }

    fn tokens(n: u64) -> Counts {
        Counts {
            requests: 1,
            prompt_tokens: n,
            completion_tokens: n,
            cached_tokens: 0,
            cost_micro_usd: n * 10,
        }
    }

    #[test]
    fn dates_round_trip_and_months_have_their_bounds() {
        let d = parse_day("2026-11-27").unwrap();
        assert_eq!(day_string(d), "2026-11-27");
        assert_eq!(month_bounds(d), (parse_day("2026-11-01").unwrap(), parse_day("2026-12-01").unwrap()));
        assert_eq!(month_bounds(parse_day("2026-12-31").unwrap()).1, parse_day("2027-01-01").unwrap());
        assert_eq!(parse_day("2026-02-31"), None);
        assert_eq!(parse_day("2026-1-1"), None);
        assert_eq!(day_of(86_400 * 3 + 5), 3);
    }

    #[test]
    fn budgets_refuse_once_spent_and_say_when_they_reset() {
        let store = UsageStore::default();
        let today = parse_day("2026-11-27").unwrap();
        let now = u64::from(today) * 86_400 + 3_600;
        store.record(row(today, "acme", "key_a"), tokens(50)); // 100 tokens
        store.record(row(today - 1, "acme", "key_b"), tokens(100)); // 200 tokens, yesterday
        let budget = |b: Budget| policies::Tenant { name: "acme".into(), tier: 0, budget: b };
        let day = Budget { tokens_per_day: Some(100), ..Budget::default() };
        let e = store.check(&budget(day), None, now).unwrap_err();
        assert_eq!(e.code(), "budget_exceeded");
        assert_eq!(e.status().as_u16(), 429);
        assert!(
            e.to_string().contains("tenant tokens_per_day") && e.to_string().contains("2026-11-28"),
            "{e}"
        );
        assert_eq!(e.retry_after_s(), Some(23 * 3600));
        let month = Budget { tokens_per_month: Some(301), ..Budget::default() };
        let left = store.check(&budget(month), None, now).unwrap().unwrap();
        assert_eq!((left.limit, left.used), (301, 300), "300 of 301: the window the headers show");
        let usd = Budget { usd_per_month: Some(0.0015), ..Budget::default() };
        assert!(
            store.check(&budget(usd), None, now).is_err(),
            "$0.0005 today + $0.001 yesterday: the month's $0.0015 spent"
        );
        // A key's budget counts that key only.
        let key = crate::keys::KeyRecord {
            id: "key_b".into(),
            hash: String::new(),
            tenant: "acme".into(),
            tier: None,
            name: None,
            created_at: 0,
            expires_at: None,
            models: None,
            budget: Budget { tokens_per_day: Some(1), ..Budget::default() },
            revoked_at: None,
            prefix: String::new(),
        };
        assert!(
            store.check(&budget(Budget::default()), Some(&key), now).is_ok(),
            "key_b spent nothing today"
        );
    }

    #[test]
    fn pending_counts_survive_a_failed_flush_and_are_not_counted_twice() {
        let store = UsageStore::default();
        store.set_clustered();
        store.record(row(10, "t", "k"), tokens(5));
        let taken = store.take_pending();
        assert_eq!(taken.len(), 1);
        store.unflushed(taken); // Redis was down
        store.record(row(10, "t", "k"), tokens(1));
        let again = store.take_pending();
        assert_eq!(again[&row(10, "t", "k")].prompt_tokens, 6);
        // Redis took them: its totals come back, with nothing pending.
        store.refreshed(&[10], vec![(row(10, "t", "k"), again[&row(10, "t", "k")])]);
        let r = store.report(10, 10, &[Dimension::Tenant]);
        assert_eq!(
            r,
            vec![(
                vec!["t".to_string()],
                Counts {
                    requests: 2,
                    prompt_tokens: 6,
                    completion_tokens: 6,
                    cached_tokens: 0,
                    cost_micro_usd: 60
                }
            )]
        );
        // Round trip through Redis's field names.
        let fields = to_redis(&row(10, "t", "k"), &tokens(3));
        assert_eq!(from_redis(10, fields), vec![(row(10, "t", "k"), tokens(3))]);
    }

    #[test]
    fn an_outage_holds_at_most_max_pending_rows_waiting_for_redis() {
        let store = UsageStore::default();
        store.set_clustered();
        for i in 0..MAX_PENDING_ROWS + 10 {
            store.record(row(1, "t", &format!("k{i}")), tokens(1));
        }
        store.record(row(1, "t", "k0"), tokens(1)); // a row already waiting still adds up
        let pending = store.take_pending();
        assert_eq!(pending.len(), MAX_PENDING_ROWS, "new rows past the bound are not held");
        assert_eq!(pending[&row(1, "t", "k0")].requests, 2);
    }

    #[test]
    fn the_report_groups_by_the_dimensions_asked() {
        let store = UsageStore::default();
        store.record(row(1, "a", "k1"), tokens(1));
        store.record(row(1, "a", "k2"), tokens(2));
        store.record(row(2, "b", "k3"), tokens(4));
        store.record(row(5, "b", "k3"), tokens(8));
        let by_tenant = store.report(1, 2, &[Dimension::Tenant]);
        assert_eq!(
            by_tenant.iter().map(|(g, c)| (g[0].as_str(), c.prompt_tokens)).collect::<Vec<_>>(),
            [("a", 3), ("b", 4)]
        );
        let by_day_key = store.report(0, 9, &[Dimension::Day, Dimension::Key]);
        assert_eq!(by_day_key.len(), 4);
        assert_eq!(by_day_key[0].0, vec!["1970-01-02".to_string(), "k1".to_string()]);
    }
}
