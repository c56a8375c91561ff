//! The `tollgate` binary as a child process: `tollgate serve` on free ports, for the tests of
//! what only the process does (its flags, its signals, its exporters).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use tollgate_testkit::{Signal, free_port, signal};

/// The `tollgate` binary serving on free ports; killed if the test ends without stopping it.
pub struct Tollgate {
    child: Option<Child>,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
}

impl Tollgate {
    /// Starts `tollgate serve` with `extra` arguments and `env` set, the OTEL_* variables of the
    /// test's own environment removed, and waits until it answers.
    pub async fn start(limits: &Path, extra: &[&str], env: &[(&str, &str)]) -> Tollgate {
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
        command
            .args(["serve", "--no-watch", "--threads", "2", "--limits"])
            .arg(limits)
            .args(["--grpc", &grpc.to_string(), "--http", &http.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (name, _) in std::env::vars() {
            if name.starts_with("OTEL_") || name == "RUST_LOG" {
                command.env_remove(name);
            }
        }
        command.envs(env.iter().copied());
        let server = Tollgate { child: Some(command.spawn().expect("the tollgate binary runs")), grpc, http };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !server.answers().await {
            assert!(Instant::now() < deadline, "tollgate serve did not answer /status within 20 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server
    }

    pub async fn answers(&self) -> bool {
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Full<Bytes>>();
        let request = hyper::Request::get(format!("http://{}/status", self.http)).body(Full::default()).unwrap();
        matches!(client.request(request).await, Ok(response) if response.status() == 200)
    }

    /// POSTs `body` to `/check_and_report` with the extra `headers`; the status.
    pub async fn check_and_report(&self, body: &str, headers: &[(&str, &str)]) -> u16 {
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Full<Bytes>>();
        let mut request = hyper::Request::post(format!("http://{}/check_and_report", self.http))
            .header("content-type", "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = client.request(request.body(Full::new(Bytes::from(body.to_string()))).unwrap()).await.unwrap();
        let status = response.status().as_u16();
        let _ = response.into_body().collect().await;
        status
    }

    /// SIGTERM, then its exit status (within 20 s).
    pub fn stop(mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        signal(child.id(), Signal::Term);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("tollgate serve did not stop within 20 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
