//! `rediss://` against a real redis-server on a TLS port, with certificates made by the test
//! (the `openssl` command): the CA given by `tls_ca` verifies the server, another CA fails with an
//! error that says so, and a server that asks for client certificates gets one from
//! `tls_cert`/`tls_key`.

use std::path::{Path, PathBuf};
use std::process::Command;

use tollgate::Quota;
use tollgate_redis::{BackendError, Redis, RedisAlgorithm, RedisLimiter};
use tollgate_testkit::{RedisServer, free_port};

/// Runs `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl is installed");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA in `dir` (`NAME.crt`, `NAME.key`).
fn ca(dir: &Path, name: &str) {
    let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
    let subject = format!("/CN={name}");
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &crt, "-days", "1", "-subj",
            &subject,
        ],
    );
}

/// A certificate `NAME.crt`/`NAME.key` for 127.0.0.1, signed by the CA `by`.
fn signed(dir: &Path, name: &str, by: &str) {
    let (key, csr, crt) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.crt"));
    openssl(dir, &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", "/CN=127.0.0.1"]);
    std::fs::write(dir.join("ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    let (ca_crt, ca_key) = (format!("{by}.crt"), format!("{by}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "1",
            "-extfile",
            "ext",
        ],
    );
}

/// Certificates in a fresh directory: CAs `ca` and `other`, `server` and `client` signed by `ca`.
fn certificates() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-tls-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    ca(&dir, "ca");
    ca(&dir, "other");
    signed(&dir, "server", "ca");
    signed(&dir, "client", "ca");
    dir
}

/// A redis-server with a TLS port (and its plain one), asking for client certificates or not.
fn tls_server(dir: &Path, clients: bool) -> (RedisServer, u16) {
    let port = free_port();
    let path = |f: &str| dir.join(f).display().to_string();
    let (port_s, cert, key, ca) = (port.to_string(), path("server.crt"), path("server.key"), path("ca.crt"));
    let auth = if clients { "yes" } else { "no" };
    let args = [
        "--tls-port",
        &port_s,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        auth,
    ];
    (RedisServer::start_with(&args), port)
}

#[tokio::test]
async fn rediss_with_the_servers_ca_connects_and_decides() {
    let dir = certificates();
    let (_server, port) = tls_server(&dir, false);
    let url = format!("rediss://127.0.0.1:{port}/?tls_ca={}", dir.join("ca.crt").display());
    let redis = Redis::connect(&url).await.unwrap();
    assert_eq!(redis.url(), format!("rediss://127.0.0.1:{port}/"), "no file paths in what is shown");
    let limiter = RedisLimiter::builder(&redis, "tls", RedisAlgorithm::FixedWindow)
        .limit("l", Quota::per_minute(1).unwrap())
        .build()
        .unwrap();
    assert!(limiter.try_acquire("k", 1).await.is_ok());
    assert!(limiter.try_acquire("k", 1).await.is_err(), "decided in Redis over TLS");
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_fails_and_says_so() {
    let dir = certificates();
    let (_server, port) = tls_server(&dir, false);
    let url = format!("rediss://127.0.0.1:{port}/?tls_ca={}", dir.join("other.crt").display());
    let err = Redis::connect(&url).await.unwrap_err();
    let text = format!("{err}: {:?}", std::error::Error::source(&err));
    assert!(matches!(err, BackendError::Connect { .. }), "{text}");
    assert!(text.to_lowercase().contains("certificate"), "the error says it is the certificate: {text}");
    assert!(!err.is_transient(), "a wrong CA does not pass with time: {text}");
}

#[tokio::test]
async fn a_server_that_asks_for_client_certificates_gets_one_from_the_url() {
    let dir = certificates();
    let (_server, port) = tls_server(&dir, true);
    let ca = dir.join("ca.crt").display().to_string();
    let without = format!("rediss://127.0.0.1:{port}/?tls_ca={ca}");
    assert!(Redis::connect(&without).await.is_err(), "no client certificate, no connection");
    let (cert, key) = (dir.join("client.crt").display().to_string(), dir.join("client.key").display().to_string());
    let with = format!("rediss://127.0.0.1:{port}/?tls_ca={ca}&tls_cert={cert}&tls_key={key}");
    let redis = Redis::connect(&with).await.unwrap();
    let pong: String = redis.query(&tollgate_redis::redis::cmd("PING")).await.unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test]
async fn a_missing_certificate_file_is_named_before_connecting() {
    let err = Redis::check_url("rediss://127.0.0.1:1/?tls_ca=/no/such/ca.pem").unwrap_err();
    assert!(
        err.to_string().contains("tls_ca: cannot read /no/such/ca.pem"),
        "the parameter and the path are named: {err}"
    );
}
