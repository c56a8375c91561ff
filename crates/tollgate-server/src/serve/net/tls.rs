//! TLS on the listeners (`--tls-cert`, `--tls-key`), and client certificates required of every
//! caller (`--tls-client-ca`: mTLS, as Envoy's `transport_socket` to the rate-limit cluster sends).
//!
//! The files are read at start, where a bad one stops the server with its name and what is wrong
//! with it, and read again whenever they change ([`crate::serve::ops::watch`]: certificates
//! rotate in Kubernetes by a Secret's `..data` symlink being swapped). A change that does not
//! load (a key that does not match its certificate, a file half written) is logged and counted,
//! and the certificates in force stay: a rotation gone wrong does not take the listeners down.
//! New connections get the new files; open ones keep what they were opened with.
//!
//! The handshake is done per connection on its own task, within the listener's read timeout, so
//! a client that opens a connection and sends nothing (or half a handshake) holds only that
//! connection, and never the accept loop.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use metrics::Counter;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::socket::Transport;

/// The PEM files of `--tls-cert`, `--tls-key` and `--tls-client-ca`.
///
/// ```
/// use tollgate_server::serve::TlsFiles;
/// let files = TlsFiles::new("/etc/tollgate/tls/tls.crt", "/etc/tollgate/tls/tls.key")
///     .with_client_ca("/etc/tollgate/tls/ca.crt");
/// assert!(files.client_ca.is_some());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// When set, a caller must present a certificate signed by one of these CAs, or the
    /// handshake fails.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// TLS with `cert` and `key`, no client certificates asked for.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> TlsFiles {
        TlsFiles { cert: cert.into(), key: key.into(), client_ca: None }
    }

    /// Requires client certificates signed by a CA of `client_ca`.
    pub fn with_client_ca(self, client_ca: impl Into<PathBuf>) -> TlsFiles {
        TlsFiles { client_ca: Some(client_ca.into()), ..self }
    }

    fn paths(&self) -> impl Iterator<Item = &Path> {
        [Some(self.cert.as_path()), Some(self.key.as_path()), self.client_ca.as_deref()].into_iter().flatten()
    }
}

/// Why the TLS files could not be used; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file holds no PEM item of the kind expected, or a broken one.
    #[error("{}: {what}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was expected and what went wrong.
        what: String,
    },
    /// rustls refused the certificate and key together (a key that is not the certificate's),
    /// or the CAs.
    #[error("{}: {why}", path.display())]
    Refused {
        /// The file (for a key that does not match: the key).
        path: PathBuf,
        /// rustls's reason.
        why: String,
    },
}

/// One listener's TLS set-up in force, swapped whole when the files change.
pub(crate) struct Tls {
    files: TlsFiles,
    /// The ALPN protocols offered (`h2` for gRPC; `h2` and `http/1.1` for HTTP).
    alpn: &'static [&'static [u8]],
    config: RwLock<Arc<ServerConfig>>,
    /// `tollgate_tls_handshake_failures_total{listener}`.
    failures: Counter,
    /// `tollgate_tls_reload_errors_total{listener}`.
    reload_errors: Counter,
}

impl Tls {
    /// Reads `files` for the listener called `listener` (`grpc` or `http`, its metrics' label),
    /// offering `alpn`. Its counters are registered in the `metrics` recorder in force.
    pub(crate) fn load(
        files: TlsFiles,
        listener: &'static str,
        alpn: &'static [&'static [u8]],
    ) -> Result<Tls, TlsError> {
        let config = build(&files, alpn)?;
        metrics::describe_counter!(
            "tollgate_tls_handshake_failures_total",
            "TLS handshakes that failed or timed out (a client without a certificate the CA signed, say), per listener"
        );
        metrics::describe_counter!(
            "tollgate_tls_reload_errors_total",
            "Changes of the TLS files that did not load (the certificates in force stay), per listener"
        );
        Ok(Tls {
            files,
            alpn,
            config: RwLock::new(Arc::new(config)),
            failures: metrics::counter!("tollgate_tls_handshake_failures_total", "listener" => listener),
            reload_errors: metrics::counter!("tollgate_tls_reload_errors_total", "listener" => listener),
        })
    }

    /// The directories to watch for changes of the files.
    pub(crate) fn dirs(&self) -> Vec<PathBuf> {
        self.files.paths().map(crate::serve::ops::watch::dir_of).collect()
    }

    /// Reads the files again; on an error, logs and counts it and keeps the set-up in force.
    pub(crate) fn reload(&self) {
        match build(&self.files, self.alpn) {
            Ok(config) => {
                *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
                tracing::info!("TLS certificates reloaded from {}", self.files.cert.display());
            }
            Err(e) => {
                self.reload_errors.increment(1);
                tracing::error!("TLS certificates not reloaded, the ones in force stay: {e}");
            }
        }
    }

    /// The handshake on `io`, within `timeout` (`None`: however long it takes).
    pub(crate) async fn accept<T: AsyncRead + AsyncWrite + Unpin>(
        &self,
        io: T,
        timeout: Option<Duration>,
    ) -> io::Result<TlsStream<T>> {
        let config = self.config.read().unwrap_or_else(|e| e.into_inner()).clone();
        let handshake = TlsAcceptor::from(config).accept(io);
        let done = match timeout {
            None => handshake.await,
            Some(t) => tokio::time::timeout(t, handshake).await.unwrap_or_else(|_| {
                Err(io::Error::new(io::ErrorKind::TimedOut, "no TLS handshake within the read timeout"))
            }),
        };
        if let Err(e) = &done {
            self.failures.increment(1);
            tracing::debug!("TLS handshake failed: {e}");
        }
        done
    }
}

/// The rustls server configuration for `files`.
fn build(files: &TlsFiles, alpn: &[&[u8]]) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = certificates(&files.cert)?;
    let key_pem = read(&files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Pem {
        path: files.key.clone(),
        what: format!("no private key (PEM, PKCS#8, PKCS#1 or SEC1): {e}"),
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Refused { path: files.cert.clone(), why: e.to_string() })?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(ca)? {
                roots.add(cert).map_err(|e| TlsError::Refused { path: ca.clone(), why: e.to_string() })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Refused { path: ca.clone(), why: e.to_string() })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| TlsError::Refused {
        path: files.key.clone(),
        why: format!("not usable with the certificate {}: {e}", files.cert.display()),
    })?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_path_buf(), source })
}

/// Every certificate of the PEM file at `path`: at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem { path: path.to_path_buf(), what: format!("a broken certificate: {e}") })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_path_buf(),
            what: "no certificate (PEM `CERTIFICATE`) in it".into(),
        });
    }
    Ok(certs)
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish_non_exhaustive()
    }
}

impl Transport for TlsStream<TcpStream> {
    const BUFFERS: bool = true;

    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // As the in-memory stream's: the caller's `write_all` registers its own waker when this
        // says `WouldBlock`.
        match Pin::new(self).poll_write(&mut Context::from_waker(std::task::Waker::noop()), buf) {
            Poll::Ready(written) => written,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}
