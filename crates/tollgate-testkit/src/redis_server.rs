//! [`RedisServer`]: a real `redis-server` per test, on a free port.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{Signal, free_port, signal};

/// A `redis-server` on 127.0.0.1 and a free port, without persistence, killed when dropped.
///
/// ```no_run
/// let mut redis = tollgate_testkit::RedisServer::start();
/// assert_eq!(redis.cli(&["PING"]), "PONG");
/// redis.pause();   // SIGSTOP: connections stay open, nothing answers
/// redis.resume();
/// redis.restart(); // SIGKILL, then an empty server on the same port
/// ```
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    /// The port it listens on.
    pub port: u16,
    args: Vec<String>,
    /// Its working directory (removed when dropped).
    pub dir: PathBuf,
}

impl RedisServer {
    /// Starts a server with no persistence on a free port.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra arguments (e.g. `["--requirepass", "s3cret"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("tollgate-redis-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory for redis-server");
        let mut server = RedisServer { child: None, port, args: extra.iter().map(|s| s.to_string()).collect(), dir };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (.ci/run installs it)");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                if s.write_all(b"PING\r\n").is_ok() {
                    let mut buf = [0u8; 64];
                    // +PONG, or -NOAUTH when a password is set: either way it is up.
                    if let Ok(1..) = s.read(&mut buf) {
                        return;
                    }
                }
            }
            assert!(Instant::now() < deadline, "redis-server on port {} did not start", self.port);
            std::thread::yield_now();
        }
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's process id (none after [`RedisServer::kill`]).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same port (empty: nothing was persisted).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP: the server hangs with its connections open, as a stuck process does.
    pub fn pause(&self) {
        signal(self.pid().expect("redis-server is running"), Signal::Stop);
    }

    /// SIGCONT after [`RedisServer::pause`].
    pub fn resume(&self) {
        signal(self.pid().expect("redis-server is running"), Signal::Cont);
    }

    /// Runs a command with redis-cli and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli must be installed (.ci/run installs it)");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
