//! [`RedisServer`]: a real `redis-server` per test, on a free port.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{Signal, free_port, signal};

/// A `redis-server` on 127.0.0.1 and a free port, without persistence, killed when dropped; or a
/// Redis Sentinel ([`RedisServer::start_sentinel`]).
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
    /// A Sentinel's configuration file (in `dir`; Sentinel rewrites it as it learns).
    sentinel_conf: Option<PathBuf>,
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
        let args = extra.iter().map(|s| s.to_string()).collect();
        let mut server = RedisServer { child: None, port, args, dir, sentinel_conf: None };
        server.spawn();
        server
    }

    /// Starts a Redis Sentinel (`redis-server sentinel.conf --sentinel`) on a free port, with
    /// `conf` as its configuration file, e.g. `sentinel monitor cache 127.0.0.1 6379 1`.
    ///
    /// ```no_run
    /// use tollgate_testkit::RedisServer;
    /// let master = RedisServer::start();
    /// let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    /// let sentinel = RedisServer::start_sentinel(&format!("sentinel monitor cache 127.0.0.1 {} 1\n", master.port));
    /// assert_eq!(sentinel.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "cache"]), format!("127.0.0.1\n{}", master.port));
    /// # drop(replica);
    /// ```
    pub fn start_sentinel(conf: &str) -> RedisServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("tollgate-sentinel-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory for redis-server --sentinel");
        let file = dir.join("sentinel.conf");
        std::fs::write(&file, conf).expect("the sentinel's configuration file");
        let mut server = RedisServer { child: None, port, args: Vec::new(), dir, sentinel_conf: Some(file) };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let mut command = Command::new("redis-server");
        if let Some(conf) = &self.sentinel_conf {
            command.arg(conf).arg("--sentinel");
        }
        let child = command
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

    /// How many times the server has run `command` (lower case, e.g. `evalsha`, `fcall`,
    /// `function|load`) since it started or `CONFIG RESETSTAT`: `INFO commandstats`'s `calls=`.
    pub fn calls(&self, command: &str) -> u64 {
        let stats = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| calls.parse().expect("INFO commandstats counts calls in decimal"))
    }

    /// Runs of the decision scripts: functions (`FCALL`) and scripts (`EVALSHA`) together.
    pub fn script_runs(&self) -> u64 {
        self.calls("fcall") + self.calls("evalsha")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
