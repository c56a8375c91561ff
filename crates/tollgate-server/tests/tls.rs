//! TLS and mTLS on both listeners (`--tls-cert`, `--tls-key`, `--tls-client-ca`), the files
//! read again when they change, and the operators' endpoints on a listener of their own
//! (`--admin`). Certificates are made by the test (a CA, the server's, a client's, and a second
//! CA nobody trusts); the clients are tonic's over rustls, and an HTTP/1.1 client over
//! tokio-rustls.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use support::{descriptor, server_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_server::serve::{ServeConfig, TlsFiles, start};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const LIMITS: &str = r#"
- namespace: ns
  max_value: 100
  seconds: 60
  conditions: []
  variables: ["descriptors[0].user"]
"#;

/// A CA and what it signs.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, PEM.
struct Pair {
    cert: String,
    key: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        Ca { issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap() }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf for `localhost` and 127.0.0.1 (a server's, or a client's).
    fn sign(&self, name: &str) -> Pair {
        let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Pair { cert: cert.pem(), key: key.serialize_pem() }
    }
}

/// Writes `pair` to `dir` as `tls.crt` and `tls.key` (each renamed into place, as a Secret's
/// files change).
fn install(dir: &Path, pair: &Pair) {
    for (name, text) in [("tls.crt", &pair.cert), ("tls.key", &pair.key)] {
        let new = dir.join(format!(".{name}.new"));
        std::fs::write(&new, text).unwrap();
        std::fs::rename(&new, dir.join(name)).unwrap();
    }
}

fn files(dir: &Path, client_ca: Option<&Path>) -> TlsFiles {
    let files = TlsFiles::new(dir.join("tls.crt"), dir.join("tls.key"));
    match client_ca {
        Some(ca) => files.with_client_ca(ca),
        None => files,
    }
}

/// A tonic client trusting `ca`, presenting `identity` if any.
async fn grpc(addr: SocketAddr, ca: &str, identity: Option<&Pair>) -> Result<RateLimitServiceClient<Channel>, String> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name("localhost");
    if let Some(pair) = identity {
        tls = tls.identity(Identity::from_pem(&pair.cert, &pair.key));
    }
    let channel = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(RateLimitServiceClient::new(channel))
}

/// One RLS call for `user`: its code, or the error.
async fn rls(client: &mut RateLimitServiceClient<Channel>, user: &str) -> Result<Code, tonic::Status> {
    let request =
        RateLimitRequest { domain: "ns".into(), descriptors: vec![descriptor(&[("user", user)])], hits_addend: 1 };
    client.should_rate_limit(request).await.map(|r| r.into_inner().overall_code())
}

/// A rustls client trusting `ca`, presenting `identity` if any.
fn client_config(ca: &str, identity: Option<&Pair>) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some(pair) => {
            let certs = CertificateDer::pem_slice_iter(pair.cert.as_bytes()).map(Result::unwrap).collect();
            builder.with_client_auth_cert(certs, PrivateKeyDer::from_pem_slice(pair.key.as_bytes()).unwrap()).unwrap()
        }
    };
    Arc::new(config)
}

/// `request` (a whole HTTP/1.1 request saying `connection: close`) over TLS to `addr`: the
/// response's status, or the error.
async fn https(addr: SocketAddr, config: Arc<rustls::ClientConfig>, request: &str) -> Result<u16, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.map_err(|e| e.to_string())?;
    tls.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    tls.read_to_end(&mut response).await.map_err(|e| e.to_string())?;
    status(&response)
}

/// The same in plaintext.
async fn http(addr: SocketAddr, request: &str) -> Result<u16, String> {
    let mut tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    tcp.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    tcp.read_to_end(&mut response).await.map_err(|e| e.to_string())?;
    status(&response)
}

fn status(response: &[u8]) -> Result<u16, String> {
    let text = String::from_utf8_lossy(response);
    let code = text.strip_prefix("HTTP/1.1 ").and_then(|rest| rest.get(..3)).and_then(|c| c.parse().ok());
    code.ok_or_else(|| format!("not an HTTP response: {text:?}"))
}

const CHECK: &str = r#"{"namespace":"ns","values":{"user":"a"},"delta":1}"#;

fn post_check() -> String {
    format!(
        "POST /check HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{CHECK}",
        CHECK.len()
    )
}

fn request(method: &str, path: &str) -> String {
    format!("{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
}

/// A directory with the server's certificate from `ca` installed.
fn tls_dir(ca: &Ca) -> PathBuf {
    let dir = support::temp_dir("tls");
    install(&dir, &ca.sign("tollgate"));
    dir
}

#[tokio::test]
async fn mtls_admits_a_client_with_a_certificate_the_ca_signed_and_no_other() {
    let (ca, other) = (Ca::new("clients and server"), Ca::new("nobody's"));
    let dir = tls_dir(&ca);
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let server = server_with(LIMITS, |c| c.tls = Some(files(&dir, Some(&ca_file)))).await;
    let (grpc_addr, http_addr) = (server.running.grpc, server.running.http);
    let client = ca.sign("envoy");

    // gRPC: with the client certificate, decided; without one, or with one another CA signed,
    // the handshake fails; in plaintext, nothing is answered.
    let mut with = grpc(grpc_addr, &ca.pem(), Some(&client)).await.expect("a client the CA signed connects");
    assert_eq!(rls(&mut with, "a").await.unwrap(), Code::Ok);
    // (The handshake fails at the server, which the client sees at its first call or before.)
    if let Ok(mut without) = grpc(grpc_addr, &ca.pem(), None).await {
        assert!(rls(&mut without, "a").await.is_err(), "no client certificate: refused");
    }
    let stranger = other.sign("stranger");
    if let Ok(mut wrong) = grpc(grpc_addr, &ca.pem(), Some(&stranger)).await {
        assert!(rls(&mut wrong, "a").await.is_err(), "a certificate the CA did not sign: refused");
    }
    let plain = RateLimitServiceClient::connect(format!("http://{grpc_addr}")).await;
    if let Ok(mut plain) = plain {
        let request =
            RateLimitRequest { domain: "ns".into(), descriptors: vec![descriptor(&[("user", "a")])], hits_addend: 1 };
        assert!(plain.should_rate_limit(request).await.is_err(), "plaintext gRPC is not served");
    }

    // HTTP: the fast path (/check) and hyper's (/counters) over TLS with the client certificate.
    let trusted = client_config(&ca.pem(), Some(&client));
    assert_eq!(https(http_addr, trusted.clone(), &post_check()).await, Ok(200));
    assert_eq!(https(http_addr, trusted.clone(), &request("GET", "/counters/ns")).await, Ok(200));
    // A client trusting another CA refuses the server; one without a certificate is refused.
    let wrong_ca = https(http_addr, client_config(&other.pem(), Some(&client)), &post_check()).await;
    assert!(wrong_ca.as_ref().is_err_and(|e| e.contains("certificate")), "{wrong_ca:?}");
    assert!(https(http_addr, client_config(&ca.pem(), None), &post_check()).await.is_err());
    assert!(http(http_addr, &post_check()).await.is_err(), "plaintext HTTP is not answered");

    // The failed handshakes are counted, per listener.
    let metrics = https(http_addr, trusted.clone(), &request("GET", "/metrics")).await;
    assert_eq!(metrics, Ok(200));
    let (_, text) = metrics_text(http_addr, trusted).await;
    let failures = |listener: &str| -> u64 {
        let series = format!("tollgate_tls_handshake_failures_total{{listener=\"{listener}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&series)).map_or(0, |v| v.trim().parse().unwrap())
    };
    assert!(failures("grpc") >= 2, "{text}");
    assert!(failures("http") >= 3, "{text}");
    server.running.shutdown().await;
}

/// `/metrics` over TLS: status and body.
async fn metrics_text(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> (u16, String) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(request("GET", "/metrics").as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tls.read_to_end(&mut response).await.unwrap();
    (status(&response).unwrap(), String::from_utf8_lossy(&response).into_owned())
}

#[tokio::test]
async fn tls_without_client_certificates_serves_any_client_that_trusts_the_server() {
    let ca = Ca::new("server");
    let dir = tls_dir(&ca);
    let server = server_with(LIMITS, |c| c.tls = Some(files(&dir, None))).await;
    let mut client = grpc(server.running.grpc, &ca.pem(), None).await.unwrap();
    assert_eq!(rls(&mut client, "a").await.unwrap(), Code::Ok);
    assert_eq!(https(server.running.http, client_config(&ca.pem(), None), &post_check()).await, Ok(200));
    // Calls sent back to back on one connection are all answered (the answers are flushed
    // through TLS, not left in its buffer).
    let tcp = TcpStream::connect(server.running.http).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(client_config(&ca.pem(), None))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let keep_alive = post_check().replace("connection: close\r\n", "");
    for _ in 0..3 {
        tls.write_all(keep_alive.as_bytes()).await.unwrap();
        let mut buf = vec![0; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf)).await.expect("answered").unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    }
    server.running.shutdown().await;
}

#[tokio::test]
async fn rotated_certificates_are_used_for_new_connections_and_a_bad_rotation_keeps_the_last_good_ones() {
    let (first, second) = (Ca::new("first"), Ca::new("second"));
    let dir = tls_dir(&first);
    let server = server_with(LIMITS, |c| c.tls = Some(files(&dir, None))).await;
    let addr = server.running.http;
    assert_eq!(https(addr, client_config(&first.pem(), None), &post_check()).await, Ok(200));

    install(&dir, &second.sign("tollgate, rotated"));
    let trusts_second = client_config(&second.pem(), None);
    let started = Instant::now();
    while https(addr, trusts_second.clone(), &post_check()).await != Ok(200) {
        assert!(started.elapsed() < Duration::from_secs(20), "the rotated certificate was never served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(https(addr, client_config(&first.pem(), None), &post_check()).await.is_err(), "the old one is gone");

    // A key that is not the certificate's: not loaded, counted, and the rotated pair stays.
    let stray = second.sign("stray");
    std::fs::write(dir.join("tls.key"), stray.key).unwrap();
    let started = Instant::now();
    loop {
        let (_, text) = metrics_text(addr, trusts_second.clone()).await;
        if text.contains("tollgate_tls_reload_errors_total{listener=\"http\"} 1") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the bad rotation was never counted:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(https(addr, trusts_second.clone(), &post_check()).await, Ok(200));
    let mut client = grpc(server.running.grpc, &second.pem(), None).await.unwrap();
    assert_eq!(rls(&mut client, "a").await.unwrap(), Code::Ok);
    server.running.shutdown().await;
}

#[tokio::test]
async fn bad_tls_files_stop_the_start_naming_the_file() {
    let ca = Ca::new("server");
    let dir = tls_dir(&ca);
    let limits = dir.join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let start_with = |tls: TlsFiles| {
        let config = ServeConfig { tls: Some(tls), ..support::config(&limits) };
        async move { start(&config, tollgate::SystemClock::new()).await.map(|_| ()).unwrap_err().to_string() }
    };
    let missing = dir.join("missing.crt");
    let error = start_with(TlsFiles::new(&missing, dir.join("tls.key"))).await;
    assert!(error.contains("missing.crt"), "{error}");
    // A key in place of the certificate, a certificate in place of the key.
    let error = start_with(TlsFiles::new(dir.join("tls.key"), dir.join("tls.key"))).await;
    assert!(error.contains("tls.key") && error.contains("no certificate"), "{error}");
    let error = start_with(TlsFiles::new(dir.join("tls.crt"), dir.join("tls.crt"))).await;
    assert!(error.contains("tls.crt") && error.contains("no private key"), "{error}");
    // A key that is not the certificate's.
    let stray = dir.join("stray.key");
    std::fs::write(&stray, ca.sign("stray").key).unwrap();
    let error = start_with(TlsFiles::new(dir.join("tls.crt"), &stray)).await;
    assert!(error.contains("stray.key") && error.contains("tls.crt"), "{error}");
    // A client CA file with no certificate.
    let error = start_with(TlsFiles::new(dir.join("tls.crt"), dir.join("tls.key")).with_client_ca(&stray)).await;
    assert!(error.contains("stray.key") && error.contains("no certificate"), "{error}");
}

#[tokio::test]
async fn the_admin_listener_serves_the_operators_and_the_decision_listener_only_decisions() {
    let server = server_with(LIMITS, |c| c.admin = Some("127.0.0.1:0".parse().unwrap())).await;
    let (decisions, admin) = (server.running.http, server.running.admin.expect("bound"));
    assert_eq!(http(decisions, &post_check()).await, Ok(200));
    assert_eq!(http(decisions, &request("GET", "/status")).await, Ok(200));
    for (method, path) in
        [("GET", "/counters/ns"), ("DELETE", "/counters/ns"), ("GET", "/limits/ns"), ("GET", "/metrics")]
    {
        assert_eq!(http(decisions, &request(method, path)).await, Ok(404), "{method} {path} on the decision listener");
        assert_eq!(http(admin, &request(method, path)).await, Ok(200), "{method} {path} on the admin listener");
    }
    assert_eq!(http(admin, &request("GET", "/status")).await, Ok(200));
    // Decisions are not taken on the admin listener, by the fast path or by hyper.
    assert_eq!(http(admin, &post_check()).await, Ok(404));
    server.running.shutdown().await;
}

#[tokio::test]
async fn a_client_that_never_finishes_its_handshake_does_not_hold_the_shutdown() {
    let ca = Ca::new("server");
    let dir = tls_dir(&ca);
    // The default 30 s read timeouts: the stop must not wait for them.
    let server = server_with(LIMITS, |c| c.tls = Some(files(&dir, None))).await;
    let silent_http = TcpStream::connect(server.running.http).await.unwrap();
    let silent_grpc = TcpStream::connect(server.running.grpc).await.unwrap();
    // Both accepted, their handshakes waiting for a ClientHello.
    assert_eq!(https(server.running.http, client_config(&ca.pem(), None), &post_check()).await, Ok(200));
    let stopped = tokio::time::timeout(Duration::from_secs(10), server.running.shutdown()).await;
    assert!(stopped.is_ok(), "the shutdown waited for a handshake that never came");
    drop((silent_http, silent_grpc));
}
