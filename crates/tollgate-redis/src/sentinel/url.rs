//! The `redis+sentinel://` URL, spelled as redis-py's users spell it (Prefect, docket, RedisVL):
//!
//! ```text
//! redis+sentinel://[user:password@]host[:port][,host[:port]...]/MASTER_NAME[/DB][?params]
//! rediss+sentinel://...   TLS to the sentinels and to the data nodes
//! ```
//!
//! The hosts are the sentinels (port 26379 when left out); the user and password are the data
//! nodes' (the master's), percent-encoded as in a `redis://` URL. The parameters:
//! `sentinel_username` / `sentinel_password` for sentinels that ask for a password, and on
//! `rediss+sentinel://` the `tls_ca`, `tls_cert`, `tls_key` of [`crate::tls`], used for the
//! sentinels and the data nodes alike (one CA for the whole deployment). Anything else is an error
//! that names it: a misspelt parameter must not be ignored silently.

use percent_encoding::percent_decode_str;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, TlsCertificates, TlsMode};

use crate::tls;

/// The sentinels' default port.
const SENTINEL_PORT: u16 = 26379;

/// What a sentinel URL says. No `Debug`: it holds passwords.
pub(crate) struct SentinelUrl {
    /// The sentinels, in the order given.
    pub(crate) sentinels: Vec<(String, u16)>,
    /// The name the sentinels monitor the master under.
    pub(crate) master: String,
    db: i64,
    username: Option<String>,
    password: Option<String>,
    sentinel_username: Option<String>,
    sentinel_password: Option<String>,
    tls: bool,
    certs: Option<TlsCertificates>,
}

const SCHEMES: [&str; 2] = ["redis+sentinel", "rediss+sentinel"];

impl SentinelUrl {
    /// True when `url` has a sentinel scheme (whatever follows it).
    pub(crate) fn is_sentinel(url: &str) -> bool {
        url.split_once("://").is_some_and(|(scheme, _)| SCHEMES.iter().any(|s| scheme.eq_ignore_ascii_case(s)))
    }

    /// Parses a sentinel URL and reads the TLS files it names. The error is the reason, naming
    /// the part of the URL at fault (the caller adds the URL, without credentials).
    pub(crate) fn parse(url: &str) -> Result<SentinelUrl, String> {
        let (scheme, rest) = url.split_once("://").ok_or("not a URL")?;
        let tls = scheme.eq_ignore_ascii_case("rediss+sentinel");
        if !tls && !scheme.eq_ignore_ascii_case("redis+sentinel") {
            return Err(format!("scheme {scheme:?} is not redis+sentinel or rediss+sentinel"));
        }
        if rest.contains('#') {
            return Err("a fragment (#...) means nothing in a sentinel URL".into());
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        // The last `@`: a password may hold a raw `@` (as `redact_url` assumes too).
        let (userinfo, rest) = match rest.rsplit_once('@') {
            Some((userinfo, rest)) => (Some(userinfo), rest),
            None => (None, rest),
        };
        let (hosts, path) =
            rest.split_once('/').ok_or("the master name is missing: add /MASTER_NAME after the sentinel hosts")?;
        let sentinels = hosts.split(',').enumerate().map(|(i, h)| host(i, h)).collect::<Result<Vec<_>, _>>()?;
        let mut segments = path.split('/');
        let master = decode("the master name", segments.next().unwrap_or_default())?;
        if master.is_empty() {
            return Err("the master name is missing: add /MASTER_NAME after the sentinel hosts".into());
        }
        let db = match segments.next() {
            None | Some("") => 0,
            Some(db) => db
                .parse::<i64>()
                .ok()
                .filter(|db| *db >= 0)
                .ok_or_else(|| format!("database {db:?} (after the master name) is not a number"))?,
        };
        if let Some(extra) = segments.find(|s| !s.is_empty()) {
            return Err(format!("unexpected {extra:?} after /MASTER_NAME/DB"));
        }
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let (user, pass) = match userinfo.split_once(':') {
                    Some((user, pass)) => (user, Some(pass)),
                    None => (userinfo, None),
                };
                let user = Some(decode("the user", user)?).filter(|u| !u.is_empty());
                let pass = pass.map(|p| decode("the password", p)).transpose()?.filter(|p| !p.is_empty());
                (user, pass)
            }
        };
        let mut parsed = SentinelUrl {
            sentinels,
            master,
            db,
            username,
            password,
            sentinel_username: None,
            sentinel_password: None,
            tls,
            certs: None,
        };
        let mut files: [Option<&str>; 3] = [None; 3];
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if value.is_empty() {
                return Err(format!("parameter {name} has no value"));
            }
            match name {
                "sentinel_username" => parsed.sentinel_username = Some(decode(name, value)?),
                "sentinel_password" => parsed.sentinel_password = Some(decode(name, value)?),
                _ => match tls::PARAMS.iter().position(|p| *p == name) {
                    Some(i) => files[i] = Some(value),
                    None => {
                        return Err(format!(
                            "unknown parameter {name:?} (a sentinel URL takes sentinel_username, sentinel_password, tls_ca, tls_cert, tls_key)"
                        ));
                    }
                },
            }
        }
        parsed.certs = tls::certificates(files, tls, "rediss+sentinel://")?;
        Ok(parsed)
    }

    /// The redis crate's client for the master: it asks the sentinels, then checks with `ROLE`
    /// that the node they name is a master.
    pub(crate) fn client(&self) -> redis::RedisResult<SentinelClient> {
        let addrs = self.sentinels.iter().map(|(host, port)| {
            let (host, port) = (host.clone(), *port);
            match self.tls {
                true => ConnectionAddr::TcpTls { host, port, insecure: false, tls_params: None },
                false => ConnectionAddr::Tcp(host, port),
            }
        });
        let mut b = SentinelClientBuilder::new(addrs, &self.master, SentinelServerType::Master)?
            .set_client_to_redis_db(self.db);
        if let Some(user) = &self.username {
            b = b.set_client_to_redis_username(user);
        }
        if let Some(pass) = &self.password {
            b = b.set_client_to_redis_password(pass);
        }
        if let Some(user) = &self.sentinel_username {
            b = b.set_client_to_sentinel_username(user);
        }
        if let Some(pass) = &self.sentinel_password {
            b = b.set_client_to_sentinel_password(pass);
        }
        if self.tls {
            b = b.set_client_to_redis_tls_mode(TlsMode::Secure);
            if let Some(certs) = &self.certs {
                b = b
                    .set_client_to_redis_certificates(certs.clone())
                    .set_client_to_sentinel_certificates(certs.clone());
            }
        }
        b.build()
    }
}

/// One sentinel, `host`, `host:port`, `[v6]` or `[v6]:port`; `i` counts from 0.
fn host(i: usize, spec: &str) -> Result<(String, u16), String> {
    let at = || format!("sentinel {} ({spec:?})", i + 1);
    let (host, port) = if let Some(v6) = spec.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(|| format!("{}: no closing ]", at()))?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or_else(|| format!("{}: expected :PORT after ]", at()))?)),
        }
    } else {
        match spec.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (spec, None),
        }
    };
    if host.is_empty() {
        return Err(format!("{}: the host is empty", at()));
    }
    let port = match port {
        None => SENTINEL_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{}: port {port:?} is not a number from 1 to 65535", at()))?,
    };
    Ok((host.to_owned(), port))
}

fn decode(what: &str, s: &str) -> Result<String, String> {
    percent_decode_str(s).decode_utf8().map(|s| s.into_owned()).map_err(|_| format!("{what} is not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> SentinelUrl {
        SentinelUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    #[test]
    fn hosts_master_db_and_credentials_are_read() {
        let u = parse("redis+sentinel://app:p%40ss@s1:26380,s2,[::1]:26381/mymaster/2?sentinel_password=x%26y");
        let hosts = [("s1".to_owned(), 26380), ("s2".to_owned(), 26379), ("::1".to_owned(), 26381)];
        assert_eq!(u.sentinels, hosts);
        assert_eq!((u.master.as_str(), u.db, u.tls), ("mymaster", 2, false));
        assert_eq!((u.username.as_deref(), u.password.as_deref()), (Some("app"), Some("p@ss")));
        assert_eq!((u.sentinel_username, u.sentinel_password.as_deref()), (None, Some("x&y")));
        let plain = parse("REDIS+SENTINEL://127.0.0.1/m/");
        assert_eq!((plain.master.as_str(), plain.db, plain.username, plain.password), ("m", 0, None, None));
        let only_password = parse("rediss+sentinel://:s3cret@h/m");
        assert_eq!(
            (only_password.username, only_password.password.as_deref(), only_password.tls),
            (None, Some("s3cret"), true)
        );
        assert!(SentinelUrl::is_sentinel("rediss+sentinel://h/m"));
        assert!(!SentinelUrl::is_sentinel("redis://h:6379/"));
        assert!(parse("redis+sentinel://h/m").client().is_ok());
    }

    #[test]
    fn each_bad_part_is_named() {
        let err = |url: &str| SentinelUrl::parse(url).err().unwrap_or_else(|| panic!("{url} parsed"));
        let missing = "the master name is missing: add /MASTER_NAME after the sentinel hosts";
        assert_eq!(err("redis+sentinel://h1,h2"), missing);
        assert_eq!(err("redis+sentinel://h1,h2/"), missing);
        assert_eq!(
            err("redis+sentinel://h1,h2:x/m"),
            "sentinel 2 (\"h2:x\"): port \"x\" is not a number from 1 to 65535"
        );
        assert_eq!(err("redis+sentinel://h1,/m"), "sentinel 2 (\"\"): the host is empty");
        assert_eq!(err("redis+sentinel://[::1/m"), "sentinel 1 (\"[::1\"): no closing ]");
        assert_eq!(err("redis+sentinel://h/m/zero"), "database \"zero\" (after the master name) is not a number");
        assert_eq!(err("redis+sentinel://h/m/0/x"), "unexpected \"x\" after /MASTER_NAME/DB");
        assert!(err("redis+sentinel://h/m?sentinel_pasword=x").starts_with("unknown parameter \"sentinel_pasword\""));
        assert_eq!(err("redis+sentinel://h/m?sentinel_password="), "parameter sentinel_password has no value");
        assert_eq!(err("redis+sentinel://h/m?tls_ca=/ca.pem"), "tls_ca is a TLS setting: use a rediss+sentinel:// URL");
        assert!(
            err("rediss+sentinel://h/m?tls_ca=/no/such/ca.pem").starts_with("tls_ca: cannot read /no/such/ca.pem: ")
        );
        assert_eq!(err("redis+sentinel://h/m#x"), "a fragment (#...) means nothing in a sentinel URL");
    }
}
