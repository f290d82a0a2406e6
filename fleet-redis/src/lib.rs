//! How gateways and engines reach the fleet's Redis.
//!
//! - `redis://[[user]:password@]host:port[/db]`: one server (the redis
//!   crate's own URL form; a managed Redis behind one address too).
//! - `redis+sentinel://[[user]:password@]host:port[,host:port…]/master[/db]`:
//!   Redis Sentinel. The sentinels are asked, in order, for `master`'s
//!   address (`SENTINEL GET-MASTER-ADDR-BY-NAME`); the first address that
//!   answers `ROLE` as a primary is used. The credentials and db are the
//!   data nodes'; the sentinels are reached without them (their default).
//!
//! [`Target::client`] resolves the address each time it is called: a caller
//! that loses its connection (the primary died, or was demoted and refuses
//! writes with `READONLY`, see [`Target::follows_failover`]) calls it again
//! and follows the promoted replica. Every step is bounded by the timeout
//! it is given; a Sentinel set that names no reachable primary is an error
//! naming why ([`Unusable`]), never a hang.

use std::time::Duration;

/// Where the fleet's Redis is.
#[derive(Clone, PartialEq, Eq)]
pub enum Target {
    /// One server, by the redis crate's URL.
    Direct(String),
    Sentinel(Sentinel),
}

/// A Sentinel set and the primary it watches.
#[derive(Clone, PartialEq, Eq)]
pub struct Sentinel {
    /// `host:port` of each sentinel, asked in this order.
    pub sentinels: Vec<String>,
    /// The monitored primary's name (`sentinel monitor <name> ...`).
    pub master: String,
    /// `user:password` or `:password` as written in the URL (still
    /// percent-encoded), for the data nodes.
    userinfo: Option<String>,
    pub db: u32,
}

/// Why a Sentinel set gave no usable primary: the label of
/// `*_redis_sentinel_errors_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unusable {
    /// No sentinel answered.
    NoSentinel,
    /// The sentinels answered but know no primary of that name.
    UnknownMaster,
    /// The named primary did not answer.
    MasterUnreachable,
    /// The named address answered as a replica (a failover in progress).
    NotPrimary,
}

impl Unusable {
    pub fn as_str(self) -> &'static str {
        match self {
            Unusable::NoSentinel => "no_sentinel",
            Unusable::UnknownMaster => "unknown_master",
            Unusable::MasterUnreachable => "master_unreachable",
            Unusable::NotPrimary => "not_primary",
        }
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Target {
    /// Parses a `redis://`, `rediss://`, `unix://` or `redis+sentinel://`
    /// URL. Errors never repeat the URL (it may hold a password).
    pub fn parse(url: &str) -> Result<Self, String> {
        let Some(rest) = url.strip_prefix("redis+sentinel://") else {
            redis::Client::open(url).map_err(|e| {
                format!("not a usable Redis URL ({:?}; redis://, unix:// or redis+sentinel://)", e.kind())
            })?;
            return Ok(Target::Direct(url.to_string()));
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_string()), h),
            None => (None, authority),
        };
        let sentinels: Vec<String> = hosts.split(',').map(str::trim).map(str::to_string).collect();
        for s in &sentinels {
            let port = s.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>()));
            if !matches!(port, Some((h, Ok(_))) if !h.is_empty()) {
                return Err(format!("redis+sentinel: `{s}` is not host:port"));
            }
        }
        let mut parts = path.split('/').filter(|p| !p.is_empty());
        let master =
            parts.next().ok_or("redis+sentinel: the URL's path must name the primary: /<master>[/db]")?;
        let db = match parts.next() {
            Some(d) => d.parse().map_err(|_| format!("redis+sentinel: db `{d}` is not a number"))?,
            None => 0,
        };
        if parts.next().is_some() {
            return Err("redis+sentinel: the path is /<master>[/db]".into());
        }
        Ok(Target::Sentinel(Sentinel { sentinels, master: master.to_string(), userinfo, db }))
    }

    /// The URL with any password replaced by `***`, for logs.
    pub fn redacted(&self) -> String {
        match self {
            Target::Direct(url) => redact(url),
            Target::Sentinel(s) => redact(&format!(
                "redis+sentinel://{}{}/{}/{}",
                s.userinfo.as_ref().map_or(String::new(), |u| format!("{u}@")),
                s.sentinels.join(","),
                s.master,
                s.db
            )),
        }
    }

    /// Whether connections must be re-resolved after a failure (a
    /// Sentinel set: the primary may have moved).
    pub fn follows_failover(&self) -> bool {
        matches!(self, Target::Sentinel(_))
    }

    /// A client for the current primary. Direct: the URL's client. Sentinel:
    /// asks the sentinels (each step bounded by `timeout`).
    pub async fn client(&self, timeout: Duration) -> Result<redis::Client, Resolve> {
        match self {
            Target::Direct(url) => redis::Client::open(url.as_str()).map_err(Resolve::Redis),
            Target::Sentinel(s) => s.primary(timeout).await,
        }
    }
}

/// Why [`Target::client`] failed.
#[derive(Debug)]
pub enum Resolve {
    Redis(redis::RedisError),
    Sentinel(Unusable),
}

impl std::fmt::Display for Resolve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resolve::Redis(e) => write!(f, "{e}"),
            Resolve::Sentinel(u) => write!(f, "sentinel: {}", u.as_str()),
        }
    }
}

impl From<Resolve> for redis::RedisError {
    fn from(r: Resolve) -> Self {
        match r {
            Resolve::Redis(e) => e,
            Resolve::Sentinel(u) => {
                redis::RedisError::from((redis::ErrorKind::Io, "sentinel", u.as_str().to_string()))
            }
        }
    }
}

impl Sentinel {
    async fn primary(&self, timeout: Duration) -> Result<redis::Client, Resolve> {
        let mut why = Unusable::NoSentinel;
        for addr in &self.sentinels {
            let Some(master) = ask(addr, &self.master, timeout).await else { continue };
            let Some((host, port)) = master else {
                why = why.max_with(Unusable::UnknownMaster);
                continue;
            };
            let auth = self.userinfo.as_ref().map_or(String::new(), |u| format!("{u}@"));
            let url = format!("redis://{auth}{host}:{port}/{}", self.db);
            let client = redis::Client::open(url).map_err(Resolve::Redis)?;
            match role(&client, timeout).await {
                Some(true) => return Ok(client),
                Some(false) => why = why.max_with(Unusable::NotPrimary),
                None => why = why.max_with(Unusable::MasterUnreachable),
            }
        }
        Err(Resolve::Sentinel(why))
    }
}

impl Unusable {
    /// The more telling of two reasons (a sentinel that answered beats one
    /// that did not).
    fn max_with(self, other: Unusable) -> Unusable {
        let rank = |u| match u {
            Unusable::NoSentinel => 0,
            Unusable::UnknownMaster => 1,
            Unusable::MasterUnreachable => 2,
            Unusable::NotPrimary => 3,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// One sentinel's answer for `master`: `None` if it did not answer,
/// `Some(None)` if it knows no such primary.
async fn ask(addr: &str, master: &str, timeout: Duration) -> Option<Option<(String, u16)>> {
    let client = redis::Client::open(format!("redis://{addr}")).ok()?;
    let query = async {
        let mut c = client.get_multiplexed_async_connection().await?;
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(master)
            .query_async::<Option<(String, u16)>>(&mut c)
            .await
    };
    tokio::time::timeout(timeout, query).await.ok()?.ok()
}

/// Whether the server answers `ROLE` as a primary; `None` if it does not
/// answer.
async fn role(client: &redis::Client, timeout: Duration) -> Option<bool> {
    let query = async {
        let mut c = client.get_multiplexed_async_connection().await?;
        redis::cmd("ROLE").query_async::<redis::Value>(&mut c).await
    };
    let value = tokio::time::timeout(timeout, query).await.ok()?.ok()?;
    let first = match value {
        redis::Value::Array(items) => items.into_iter().next(),
        _ => None,
    };
    Some(match first {
        Some(redis::Value::BulkString(b)) => b == b"master",
        Some(redis::Value::SimpleString(s)) => s == "master",
        _ => false,
    })
}

/// A URL with the password in its userinfo replaced by `***` (the user
/// kept), for logs and `Debug`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    match authority.rfind('@') {
        Some(at) => {
            let user = rest[..at].split_once(':').map_or(&rest[..at], |(u, _)| u);
            format!("{scheme}://{user}:***@{}", &rest[at + 1..])
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sentinel_urls_and_refuses_malformed_ones_without_echoing_secrets() {
        let t = Target::parse("redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26379/fleet/2").unwrap();
        let Target::Sentinel(s) = &t else { panic!("{t:?}") };
        assert_eq!(s.sentinels, ["10.0.0.1:26379", "10.0.0.2:26379"]);
        assert_eq!((s.master.as_str(), s.db), ("fleet", 2));
        assert!(t.follows_failover());
        let shown = format!("{t:?}");
        assert_eq!(shown, "redis+sentinel://:***@10.0.0.1:26379,10.0.0.2:26379/fleet/2");
        for bad in [
            "redis+sentinel://:pw@10.0.0.1/fleet",
            "redis+sentinel://10.0.0.1:26379",
            "redis+sentinel://10.0.0.1:26379/fleet/x",
            "redis+sentinel://:26379/fleet",
            "nonsense://:pw@host",
        ] {
            let err = Target::parse(bad).unwrap_err();
            assert!(!err.contains("pw"), "{bad}: {err}");
        }
        // No TLS in this build: refused at start rather than failing later.
        assert!(Target::parse("rediss://:pw@redis.example:6380").is_err());
        let direct = Target::parse("redis://:pw@127.0.0.1:6379/0").unwrap();
        assert!(!direct.follows_failover());
        assert_eq!(direct.redacted(), "redis://:***@127.0.0.1:6379/0");
    }

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(redact("redis://:hunter2@10.0.0.1:6379/0"), "redis://:***@10.0.0.1:6379/0");
        assert_eq!(redact("rediss://app:hunter2@r:6380"), "rediss://app:***@r:6380");
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("redis://h:1/0?x=a@b"),
            "redis://h:1/0?x=a@b",
            "an @ after the host is not userinfo"
        );
    }

    #[tokio::test]
    #[allow(clippy::disallowed_methods)] // real sockets, real time
    async fn a_sentinel_set_nobody_answers_for_is_an_error_within_the_timeout() {
        // Ports nothing listens on (bound, then released).
        let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let t =
            Target::parse(&format!("redis+sentinel://127.0.0.1:{},127.0.0.1:{}/m", free(), free())).unwrap();
        let started = std::time::Instant::now();
        let err = t.client(Duration::from_millis(200)).await.unwrap_err();
        assert!(matches!(err, Resolve::Sentinel(Unusable::NoSentinel)), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }
}
