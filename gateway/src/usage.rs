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

mod calendar;
mod sync;

use calendar::month_bounds;
pub use calendar::{day_of, day_string, parse_day};
pub use sync::{refresh_range, run, sync_keys, sync_usage};

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
        let fields = sync::to_redis(&row(10, "t", "k"), &tokens(3));
        assert_eq!(sync::from_redis(10, fields), vec![(row(10, "t", "k"), tokens(3))]);
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
