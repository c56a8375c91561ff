//! A client flooding the server with distinct long values cannot grow its memory past the
//! counter tables' byte budget (`--max-counter-bytes`) and a fixed margin; with the default
//! request bounds such values are refused before anything is kept.
//!
//! The real `tollgate` binary is started (so its own allocator and resident memory are
//! measured, from /proc), flooded over raw HTTP/1.1 and a real gRPC client, and its `VmRSS` read
//! before and after. The short form runs in CI; `TOLLGATE_FLOOD_FULL=1` sends what the issue's
//! attack sent and more (1,000 values of 1 MB over HTTP, 250 of 4 MB over gRPC).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

mod support;

const LIMITS: &str = "- {namespace: api, max_value: 1000, seconds: 60, variables: ['descriptors[0].user']}\n";
const MIB: usize = 1 << 20;
/// What the server may grow by beyond its budget: request buffers, the allocator's free pages,
/// the runtime's. Without a byte budget the short flood alone grows it by over 150 MiB.
const MARGIN: usize = 64 * MIB;

fn full() -> bool {
    std::env::var_os("TOLLGATE_FLOOD_FULL").is_some_and(|v| v == "1")
}

/// The `tollgate serve` process, killed when dropped.
struct Served {
    child: Child,
    http: SocketAddr,
    grpc: SocketAddr,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    fn start(extra: &[&str]) -> Served {
        let dir = support::temp_dir("flood");
        let limits = dir.join("limits.yaml");
        std::fs::write(&limits, LIMITS).unwrap();
        let mut args = vec!["serve", "--limits", limits.to_str().unwrap(), "--grpc", "127.0.0.1:0"];
        args.extend(["--http", "127.0.0.1:0", "--no-watch", "--threads", "1"]);
        args.extend(extra);
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(&args)
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("the tollgate binary starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (mut http, mut grpc) = (None, None);
        while http.is_none() || grpc.is_none() {
            let line = lines.next().expect("the server logs its addresses before exiting").unwrap();
            let addr =
                |after: &str| line.split(after).nth(1).map(|a| a.split_whitespace().next().unwrap().parse().unwrap());
            if line.contains("HTTP API listening") {
                http = addr("http://");
            } else if line.contains("Envoy RLS and RLQS (gRPC) listening on") {
                grpc = addr("listening on ");
            }
        }
        // Keep draining the log so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Served { child, http: http.unwrap(), grpc: grpc.unwrap() }
    }

    fn rss(&self) -> usize {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024
    }

    /// GETs `path` on its own connection: the body.
    fn get(&self, path: &str) -> String {
        let mut conn = TcpStream::connect(self.http).unwrap();
        write!(conn, "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
        let mut text = String::new();
        conn.read_to_string(&mut text).unwrap();
        text.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
    }

    /// POSTs `/check_and_report` for each value on one kept-alive connection; the statuses.
    fn flood_http(&self, values: impl Iterator<Item = String>) -> Vec<u16> {
        let mut conn = TcpStream::connect(self.http).unwrap();
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        values
            .map(|value| {
                let body = format!(r#"{{"namespace":"api","values":{{"user":"{value}"}},"delta":1}}"#);
                let head = format!(
                    "POST /check_and_report HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                conn.write_all(head.as_bytes()).unwrap();
                conn.write_all(body.as_bytes()).unwrap();
                read_response(&mut reader)
            })
            .collect()
    }

    /// Sends each value as an RLS descriptor; the gRPC codes (0 for OK).
    async fn flood_grpc(&self, values: impl Iterator<Item = String>) -> Vec<i32> {
        let mut client = RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
            .max_decoding_message_size(8 * MIB)
            .max_encoding_message_size(8 * MIB);
        let mut codes = Vec::new();
        for value in values {
            let request = RateLimitRequest {
                domain: "api".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry { key: "user".into(), value }],
                    ..Default::default()
                }],
                hits_addend: 1,
            };
            codes.push(match client.should_rate_limit(request).await {
                Ok(_) => 0,
                Err(status) => status.code() as i32,
            });
        }
        codes
    }
}

/// Reads one response off a kept-alive connection: its status (the body is read and dropped).
fn read_response(reader: &mut BufReader<TcpStream>) -> u16 {
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    let code = status.split_whitespace().nth(1).unwrap_or_else(|| panic!("a status line: {status:?}")).parse().unwrap();
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
    }
    reader.read_exact(&mut vec![0; length]).unwrap();
    code
}

/// `n` distinct values of `size` bytes each.
fn values(n: usize, size: usize, tag: &'static str) -> impl Iterator<Item = String> {
    (0..n).map(move |i| {
        let mut v = format!("{tag}{i}-");
        v.extend(std::iter::repeat_n('x', size - v.len()));
        v
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_long_values_cannot_grow_memory_past_the_counter_byte_budget() {
    let budget = 16 * MIB;
    let served = Served::start(&[
        "--max-value-bytes",
        "5MB",
        "--max-request-bytes",
        "5MB",
        "--max-counter-bytes",
        "16MiB",
        // One shard: the whole budget is one table's (see --max-counter-bytes).
        "--max-counters",
        "1000",
    ]);
    let before = served.rss();
    let (http_n, grpc_n) = if full() { (1000, 250) } else { (100, 20) };
    let statuses = served.flood_http(values(http_n, MIB, "h"));
    let kept = statuses.iter().filter(|&&s| s == 200).count();
    assert!(statuses.iter().all(|&s| s == 200 || s == 429), "{statuses:?}");
    // 16 MiB hold 15 counters of 1 MiB (each with its entry): the rest are turned away.
    assert!((10..=16).contains(&kept), "{kept} values of 1 MiB were kept within 16 MiB");
    let codes = served.flood_grpc(values(grpc_n, 4_000_000, "g")).await;
    assert!(codes.iter().all(|&c| c == 0), "{codes:?}");
    let grown = served.rss().saturating_sub(before);
    eprintln!("{kept} of {http_n} values kept; grew by {:.1} MiB", grown as f64 / MIB as f64);
    assert!(
        grown <= budget + MARGIN,
        "{http_n} x 1 MiB over HTTP and {grpc_n} x 4 MB over gRPC grew the server by {} MiB (budget {} MiB + margin {} MiB)",
        grown / MIB,
        budget / MIB,
        MARGIN / MIB
    );
    let metrics = served.get("/metrics");
    assert!(
        metrics.lines().any(|l| l.starts_with("tollgate_counters_bytes_max{") && l.ends_with(" 16777216")),
        "{metrics}"
    );
    let bytes: usize = metrics
        .lines()
        .find(|l| l.starts_with("tollgate_counters_bytes{"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap();
    assert!(bytes <= budget && bytes > budget / 2, "the table holds {bytes} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_default_bounds_long_values_are_refused_and_nothing_is_kept() {
    let served = Served::start(&[]);
    let before = served.rss();
    let (http_n, grpc_n) = if full() { (300, 100) } else { (60, 10) };
    let statuses = served.flood_http(values(http_n, MIB, "h"));
    assert!(statuses.iter().all(|&s| s == 400), "{statuses:?}");
    let codes = served.flood_grpc(values(grpc_n, 4_000_000, "g")).await;
    assert!(codes.iter().all(|&c| c == tonic::Code::InvalidArgument as i32), "{codes:?}");
    let grown = served.rss().saturating_sub(before);
    eprintln!("grew by {:.1} MiB", grown as f64 / MIB as f64);
    assert!(grown <= MARGIN, "refused calls grew the server by {} MiB", grown / MIB);
    let metrics = served.get("/metrics");
    let refused = format!("tollgate_requests_refused_total{{bound=\"value_bytes\"}} {}", http_n + grpc_n);
    assert!(metrics.lines().any(|l| l == refused), "{refused} in\n{metrics}");
    assert!(metrics.lines().any(|l| l.starts_with("tollgate_counters{") && l.ends_with(" 0")), "{metrics}");
}
