//! TLS settings carried by the URL, so every crate that takes a Redis URL (the server's
//! `--redis-url`, the pump, Python's `redis_url`) reaches a managed Redis the same way:
//!
//! - `rediss://host:6380/0`: TLS, the server verified against the system's root certificates;
//! - `?tls_ca=/path/ca.pem`: verified against this CA (PEM) instead;
//! - `&tls_cert=/path/client.pem&tls_key=/path/client.key`: a client certificate (mutual TLS).
//!
//! The files are read when connecting; a file that cannot be read, a certificate without its key,
//! or TLS parameters on a `redis://` URL are errors that name the parameter. A
//! `rediss+sentinel://` URL takes the same parameters (see [`crate::sentinel`]).

use redis::{ClientTlsConfig, TlsCertificates};

/// A URL's own part (what `redis` parses) and the certificates its TLS parameters name.
#[derive(Debug)]
pub(crate) struct TlsUrl {
    /// The URL without the `tls_*` parameters.
    pub(crate) url: String,
    /// `None` without `tls_*` parameters (a `rediss://` URL then uses the system's roots).
    pub(crate) certs: Option<TlsCertificates>,
}

/// The TLS parameters, in the order of the files [`certificates`] takes.
pub(crate) const PARAMS: [&str; 3] = ["tls_ca", "tls_cert", "tls_key"];

/// Reads the files named by the `tls_ca`, `tls_cert` and `tls_key` parameters (in [`PARAMS`]
/// order); `None` when none is given. `tls` says whether the URL's scheme is a TLS one (spelled
/// `scheme` in the error when it is not). The error is the reason, naming the parameter.
pub(crate) fn certificates(
    files: [Option<&str>; 3],
    tls: bool,
    scheme: &str,
) -> Result<Option<TlsCertificates>, String> {
    if files.iter().all(Option::is_none) {
        return Ok(None);
    }
    if !tls {
        let name = PARAMS[files.iter().position(Option::is_some).unwrap_or(0)];
        return Err(format!("{name} is a TLS setting: use a {scheme} URL"));
    }
    let read = |i: usize| -> Result<Option<Vec<u8>>, String> {
        files[i]
            .map(|path| std::fs::read(path).map_err(|e| format!("{}: cannot read {path}: {e}", PARAMS[i])))
            .transpose()
    };
    let client_tls = match (read(1)?, read(2)?) {
        (Some(client_cert), Some(client_key)) => Some(ClientTlsConfig { client_cert, client_key }),
        (None, None) => None,
        (Some(_), None) => return Err("tls_cert needs tls_key (the client certificate's private key)".into()),
        (None, Some(_)) => return Err("tls_key needs tls_cert (the client certificate)".into()),
    };
    Ok(Some(TlsCertificates { client_tls, root_cert: read(0)? }))
}

impl TlsUrl {
    /// Takes the `tls_*` parameters out of `url` and reads the files they name. The error is the
    /// reason, naming the parameter (the caller adds the URL, without credentials).
    pub(crate) fn parse(url: &str) -> Result<TlsUrl, String> {
        let (head, fragment) = match url.split_once('#') {
            Some((head, fragment)) => (head, Some(fragment)),
            None => (url, None),
        };
        let Some((base, query)) = head.split_once('?') else {
            return Ok(TlsUrl { url: url.to_owned(), certs: None });
        };
        let mut files: [Option<&str>; 3] = [None; 3];
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match PARAMS.iter().position(|p| *p == name) {
                Some(_) if value.is_empty() => return Err(format!("{name} needs a file path")),
                Some(i) => files[i] = Some(value),
                None => kept.push(pair),
            }
        }
        let mut url = base.to_owned();
        if !kept.is_empty() {
            url = format!("{url}?{}", kept.join("&"));
        }
        if let Some(fragment) = fragment {
            url = format!("{url}#{fragment}");
        }
        let certs = certificates(files, base.starts_with("rediss://"), "rediss://")?;
        Ok(TlsUrl { url, certs })
    }

    /// The client for one server.
    pub(crate) fn client(self) -> redis::RedisResult<redis::Client> {
        match self.certs {
            Some(certs) => redis::Client::build_with_tls(self.url, certs),
            None => redis::Client::open(self.url),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_and_other_parameters_kept() {
        let plain = TlsUrl::parse("redis://h:6379/0?protocol=resp3").unwrap();
        assert_eq!((plain.url.as_str(), plain.certs.is_none()), ("redis://h:6379/0?protocol=resp3", true));
        let dir = std::env::temp_dir().join(format!("tollgate-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, b"not checked here").unwrap();
        let url = format!("rediss://h:6380/0?tls_ca={}&protocol=resp3", ca.display());
        let tls = TlsUrl::parse(&url).unwrap();
        assert_eq!(tls.url, "rediss://h:6380/0?protocol=resp3");
        let certs = tls.certs.unwrap();
        assert_eq!((certs.root_cert.as_deref(), certs.client_tls.is_none()), (Some(&b"not checked here"[..]), true));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_tls_parameters_are_named() {
        let err = |url: &str| TlsUrl::parse(url).unwrap_err();
        assert_eq!(err("redis://h/?tls_ca=/x.pem"), "tls_ca is a TLS setting: use a rediss:// URL");
        assert_eq!(err("rediss://h/?tls_ca="), "tls_ca needs a file path");
        assert!(err("rediss://h/?tls_ca=/no/such/ca.pem").starts_with("tls_ca: cannot read /no/such/ca.pem: "));
        let dir = std::env::temp_dir().join(format!("tollgate-tls-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = dir.join("c.pem");
        std::fs::write(&cert, b"x").unwrap();
        assert_eq!(
            err(&format!("rediss://h/?tls_cert={}", cert.display())),
            "tls_cert needs tls_key (the client certificate's private key)"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
