//! `rediss://` against a real redis-server on a TLS port, with certificates made by the test
//! (the `openssl` command): the CA given by `tls_ca` verifies the server, another CA fails with an
//! error that says so, and a server that asks for client certificates gets one from
//! `tls_cert`/`tls_key`.

use tollgate::Quota;
use tollgate_redis::{AlgorithmKind, BackendError, Redis, RedisLimiter};
use tollgate_testkit::{Certificates, RedisServer, free_port};

/// A redis-server with a TLS port (and its plain one), asking for client certificates or not.
fn tls_server(certs: &Certificates, clients: bool) -> (RedisServer, u16) {
    let port = free_port();
    let args = certs.server_args(port, clients);
    (RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>()), port)
}

#[tokio::test]
async fn rediss_with_the_servers_ca_connects_and_decides() {
    let certs = Certificates::make();
    let (_server, port) = tls_server(&certs, false);
    let url = format!("rediss://127.0.0.1:{port}/?tls_ca={}", certs.path("ca.crt"));
    let redis = Redis::connect(&url).await.unwrap();
    assert_eq!(redis.url(), format!("rediss://127.0.0.1:{port}/"), "no file paths in what is shown");
    let limiter = RedisLimiter::builder(&redis, "tls", AlgorithmKind::FixedWindow)
        .limit("l", Quota::per_minute(1).unwrap())
        .build()
        .unwrap();
    assert!(limiter.try_acquire("k", 1).await.is_ok());
    assert!(limiter.try_acquire("k", 1).await.is_err(), "decided in Redis over TLS");
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_fails_and_says_so() {
    let certs = Certificates::make();
    let (_server, port) = tls_server(&certs, false);
    let url = format!("rediss://127.0.0.1:{port}/?tls_ca={}", certs.path("other.crt"));
    let err = Redis::connect(&url).await.unwrap_err();
    let text = format!("{err}: {:?}", std::error::Error::source(&err));
    assert!(matches!(err, BackendError::Connect { .. }), "{text}");
    assert!(text.to_lowercase().contains("certificate"), "the error says it is the certificate: {text}");
    assert!(!err.is_transient(), "a wrong CA does not pass with time: {text}");
}

#[tokio::test]
async fn a_server_that_asks_for_client_certificates_gets_one_from_the_url() {
    let certs = Certificates::make();
    let (_server, port) = tls_server(&certs, true);
    let ca = certs.path("ca.crt").to_string();
    let without = format!("rediss://127.0.0.1:{port}/?tls_ca={ca}");
    assert!(Redis::connect(&without).await.is_err(), "no client certificate, no connection");
    let (cert, key) = (certs.path("client.crt"), certs.path("client.key"));
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
