//! How gateways and engines reach the fleet's Redis.
//!
//! - `redis://[[user]:password@]host:port[/db]`: one server (the redis
//!   crate's own URL form; a managed Redis behind one address too).
//! - `rediss://…[?ca_file=PATH]`: the same over TLS (rustls, ring). The
//!   server's certificate is checked against the system's roots (read the
//!   usual way, `SSL_CERT_FILE` included), or against only the PEM CA in
//!   `ca_file` (a private CA). `ca_file` is ours, not the crate's: it is
//!   read once, at parse, so a missing file stops the process at start.
//! - `redis+sentinel://[[user]:password@]host:port[,host:port…]/master[/db]`:
//!   Redis Sentinel, through the redis crate's `SentinelClient`: the
//!   sentinels are asked for `master` and the first address that answers
//!   `ROLE` as a primary is used. The credentials and db are the data
//!   nodes'; the sentinels are reached without them (their default). The
//!   URL form is ours (the crate takes a list of sentinel addresses).
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
    Direct(Direct),
    Sentinel(Sentinel),
}

/// One server: the redis crate's URL (without our `ca_file` parameter)
/// and, for `rediss://` with a private CA, that CA's PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Direct {
    url: String,
    ca: Option<Vec<u8>>,
}

/// A Sentinel set and the primary it watches.
#[derive(Clone, PartialEq, Eq)]
pub struct Sentinel {
    /// `host:port` of each sentinel.
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
    /// The sentinels answered but name no primary that is up by that name
    /// (an unknown name, or the primary is down and not yet replaced).
    NoPrimary,
    /// No sentinel, or not the primary they named, answered in time.
    Unreachable,
}

impl Unusable {
    pub fn as_str(self) -> &'static str {
        match self {
            Unusable::NoPrimary => "no_primary",
            Unusable::Unreachable => "unreachable",
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
            return Direct::parse(url).map(Target::Direct);
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
            Target::Direct(d) => redact(&d.url),
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
            Target::Direct(d) => d.client().map_err(Resolve::Redis),
            Target::Sentinel(s) => s.primary(timeout).await,
        }
    }
}

impl Direct {
    fn parse(url: &str) -> Result<Self, String> {
        const CA: &str = "ca_file=";
        let (base, ca_file) = match url.split_once('?') {
            Some((base, query)) => {
                let (ca, rest): (Vec<&str>, Vec<&str>) = query.split('&').partition(|p| p.starts_with(CA));
                let ca_file = match ca.as_slice() {
                    [] => None,
                    [one] => Some(&one[CA.len()..]),
                    _ => return Err("ca_file is given more than once".into()),
                };
                let url = match rest.join("&") {
                    q if q.is_empty() => base.to_string(),
                    q => format!("{base}?{q}"),
                };
                (url, ca_file)
            }
            None => (url.to_string(), None),
        };
        let tls = base.starts_with("rediss://");
        let ca = match ca_file {
            Some(_) if !tls => return Err("ca_file is for rediss:// (TLS) URLs".into()),
            Some("") => return Err("ca_file is empty".into()),
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| format!("ca_file {path}: {e}"))?;
                if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
                    return Err(format!("ca_file {path}: no PEM certificate in it"));
                }
                Some(pem)
            }
            None => None,
        };
        let direct = Direct { url: base, ca };
        direct.client().map_err(|e| {
            format!(
                "not a usable Redis URL ({:?}; redis://, rediss://, unix:// or redis+sentinel://)",
                e.kind()
            )
        })?;
        Ok(direct)
    }

    fn client(&self) -> redis::RedisResult<redis::Client> {
        if self.url.starts_with("rediss://") {
            // rustls needs one process-wide provider; ours is ring. Installed
            // once (a later call finds it there and changes nothing).
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        match &self.ca {
            Some(ca) => redis::Client::build_with_tls(
                self.url.as_str(),
                redis::TlsCertificates { client_tls: None, root_cert: Some(ca.clone()) },
            ),
            None => redis::Client::open(self.url.as_str()),
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
        use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
        let sentinels: Vec<String> = self.sentinels.iter().map(|a| format!("redis://{a}")).collect();
        // The data nodes' credentials and db, parsed the crate's way from a
        // URL of the same userinfo.
        let auth = self.userinfo.as_ref().map_or(String::new(), |u| format!("{u}@"));
        let node = redis::Client::open(format!("redis://{auth}localhost/{}", self.db))
            .map_err(Resolve::Redis)?
            .get_connection_info()
            .redis_settings()
            .clone();
        let mut client = SentinelClient::build(
            sentinels,
            self.master.clone(),
            Some(SentinelNodeConnectionInfo::default().set_redis_connection_info(node)),
            SentinelServerType::Master,
        )
        .map_err(Resolve::Redis)?;
        match tokio::time::timeout(timeout, client.async_get_client()).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) if e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel => {
                Err(Resolve::Sentinel(Unusable::NoPrimary))
            }
            Ok(Err(_)) | Err(_) => Err(Resolve::Sentinel(Unusable::Unreachable)),
        }
    }
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
        // TLS: the system's roots, or a CA file read at parse (a missing
        // or non-PEM one refused at start, not at the first connection).
        assert!(Target::parse("rediss://:pw@redis.example:6380").is_ok());
        for bad in [
            "rediss://:pw@r:6380?ca_file=/nonexistent/ca.pem",
            "rediss://:pw@r:6380?ca_file=",
            "rediss://:pw@r:6380?ca_file=/etc/hostname",
            "redis://:pw@r:6379?ca_file=/etc/hostname",
            "rediss://:pw@r:6380?ca_file=a&ca_file=b",
        ] {
            let err = Target::parse(bad).unwrap_err();
            assert!(!err.contains("pw"), "{bad}: {err}");
        }
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
        assert!(matches!(err, Resolve::Sentinel(Unusable::Unreachable)), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }
}
