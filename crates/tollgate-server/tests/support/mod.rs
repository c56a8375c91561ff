//! Shared by the server tests: a server on free ports with its own limits file, and clients for
//! both protocols over real sockets.
#![allow(dead_code)]

pub mod binary;
pub mod fleet;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tollgate::ManualClock;
use tollgate_server::serve::{Mode, Running, ServeConfig, Storage, start};
use tonic::transport::Channel;

/// A fresh directory for one test's files, `tollgate-tests/<pid>-<n>-<name>` in the system's
/// temporary directory. It outlives the test (a server under test may read it to its end), so the
/// first call in each test process removes those that processes no longer running left behind.
pub fn temp_dir(name: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let tests = std::env::temp_dir().join("tollgate-tests");
    SWEPT.call_once(|| remove_dead_processes_dirs(&tests));
    let dir = tests.join(format!("{}-{}-{name}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Removes the [`temp_dir`]s in `tests` of test processes that are no longer running (on Linux,
/// where `/proc` says which are).
fn remove_dead_processes_dirs(tests: &std::path::Path) {
    if !cfg!(target_os = "linux") {
        return;
    }
    let Ok(entries) = std::fs::read_dir(tests) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|name| name.split('-').next()?.parse::<u32>().ok()) else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

pub struct Server {
    pub running: Running<ManualClock>,
    pub clock: ManualClock,
    pub limits: PathBuf,
    pub http: Client<HttpConnector, Full<Bytes>>,
}

/// A server for `yaml` on free ports with a manual clock.
pub async fn server(yaml: &str, mode: Mode, shadow: bool, watch: bool) -> Server {
    server_on(yaml, mode, shadow, watch, Storage::Memory).await
}

/// The same, with counters in `storage`.
pub async fn server_on(yaml: &str, mode: Mode, shadow: bool, watch: bool, storage: Storage) -> Server {
    server_with(yaml, |config| {
        config.mode = mode;
        config.shadow = shadow;
        config.watch = watch;
        config.storage = storage;
    })
    .await
}

/// The tests' server configuration for `limits`: ports the OS chooses, not watching, in memory,
/// and the server's (manual) clock timing Redis windows too, so tests can step through them.
pub fn config(limits: &std::path::Path) -> ServeConfig {
    ServeConfig {
        grpc: "127.0.0.1:0".parse().unwrap(),
        http: "127.0.0.1:0".parse().unwrap(),
        watch: false,
        time: tollgate_server::serve::TimeSource::Server,
        ..ServeConfig::new(limits)
    }
}

/// A server for `yaml` (accuracy mode, no watching, in memory) with `edit` applied to its config.
pub async fn server_with(yaml: &str, edit: impl FnOnce(&mut ServeConfig)) -> Server {
    let dir = temp_dir("serve");
    let limits = dir.join("limits.yaml");
    std::fs::write(&limits, yaml).unwrap();
    server_at(limits, edit).await.unwrap()
}

/// A server for the limits at `limits` (a file, or a directory with `config.format` set to
/// envoy's), in accuracy mode, not watching, in memory, with `edit` applied to its config.
pub async fn server_at(
    limits: PathBuf,
    edit: impl FnOnce(&mut ServeConfig),
) -> Result<Server, tollgate_server::serve::ServeError> {
    server_on_clock(limits, ManualClock::new(), edit).await
}

/// The same, on `clock` (servers that share one, as replicas on one Redis do in time).
pub async fn server_on_clock(
    limits: PathBuf,
    clock: ManualClock,
    edit: impl FnOnce(&mut ServeConfig),
) -> Result<Server, tollgate_server::serve::ServeError> {
    let mut config = config(&limits);
    edit(&mut config);
    let running = start(&config, clock.clone()).await?;
    let http = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    Ok(Server { running, clock, limits, http })
}

impl Server {
    pub async fn rls(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.running.grpc)).await.unwrap()
    }

    /// Calls a method of Kuadrant's service (`CheckRateLimit`, `Report`) with a plain tonic
    /// client, as Kuadrant's wasm-shim does.
    pub async fn kuadrant(&self, method: &str, request: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        let channel = Channel::from_shared(format!("http://{}", self.running.grpc)).unwrap().connect().await.unwrap();
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let path = format!("/kuadrant.service.ratelimit.v1.RateLimitService/{method}");
        let path = http::uri::PathAndQuery::try_from(path).unwrap();
        let codec = tonic_prost::ProstCodec::default();
        grpc.unary(tonic::Request::new(request), path, codec).await.map(tonic::Response::into_inner)
    }

    /// POST `body` to `path`: status, headers, body text.
    pub async fn post(&self, path: &str, body: impl AsRef<[u8]>) -> (u16, hyper::HeaderMap, String) {
        let request = hyper::Request::post(format!("http://{}{path}", self.running.http))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::copy_from_slice(body.as_ref())))
            .unwrap();
        let response = self.http.request(request).await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    }

    /// Any method, with an optional body: status, headers, body text.
    pub async fn send(&self, method: &str, path: &str, body: Option<&str>) -> (u16, hyper::HeaderMap, String) {
        let mut request = hyper::Request::builder().method(method).uri(format!("http://{}{path}", self.running.http));
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request.body(Full::new(Bytes::from(body.unwrap_or_default().to_string()))).unwrap();
        let response = self.http.request(request).await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let request =
            hyper::Request::get(format!("http://{}{path}", self.running.http)).body(Full::new(Bytes::new())).unwrap();
        let response = self.http.request(request).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }
}

pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() }).collect(),
        ..Default::default()
    }
}

pub async fn should_rate_limit(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> RateLimitResponse {
    let request = RateLimitRequest { domain: domain.to_string(), descriptors, hits_addend: hits };
    client.should_rate_limit(request).await.unwrap().into_inner()
}

/// Seed 003's two limits, with one counter per `round` so each round starts empty.
pub const SEED_003: &str = r#"
- namespace: example.org
  max_value: 4
  seconds: 60
  variables: ["descriptors[0].round"]
- namespace: example.org
  name: posts
  max_value: 2
  seconds: 1
  conditions: ["req.method == 'POST'"]
  variables: ["round"]
"#;

/// Seed 003's POST, POST, POST, GET, GET sent at once over RLS: the POSTs and GETs allowed, and
/// every answer (for the failure message).
pub async fn seed_003_round(
    client: &RateLimitServiceClient<Channel>,
    round: &str,
) -> ((usize, usize), Vec<(&'static str, i32)>) {
    let calls = ["POST", "POST", "POST", "GET", "GET"].map(|method| {
        let mut client = client.clone();
        async move {
            let d = descriptor(&[("req.method", method), ("round", round)]);
            (method, should_rate_limit(&mut client, "example.org", vec![d], 1).await.overall_code)
        }
    });
    let results = futures::future::join_all(calls).await;
    let ok = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code::Ok as i32;
    let allowed = |m: &str| results.iter().filter(|(method, code)| *method == m && *code == ok).count();
    ((allowed("POST"), allowed("GET")), results)
}

/// Waits (for the limits watcher, not for time to pass) until the server's generation of limits
/// reaches `want`, for at most 10 s; returns the generation reached.
pub async fn generation(server: &Server, want: u64) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let generation = server.running.engine.loaded().generation;
        if generation >= want || std::time::Instant::now() > deadline {
            return generation;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
