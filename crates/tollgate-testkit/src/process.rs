//! Process faults: signals to a process by id, and free ports to start servers on.

use std::net::TcpListener;
use std::process::Command;

/// A signal a fault test sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGSTOP: the process hangs (its sockets stay open, nothing answers).
    Stop,
    /// SIGCONT: a stopped process runs again.
    Cont,
    /// SIGKILL: a crash.
    Kill,
    /// SIGTERM: a polite stop.
    Term,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Signal::Stop => "STOP",
            Signal::Cont => "CONT",
            Signal::Kill => "KILL",
            Signal::Term => "TERM",
        }
    }
}

/// Sends `signal` to process `pid` (with `kill(1)`, which every machine has, so the kit needs no
/// libc binding). Panics if it cannot be sent: a fault test that cannot inject its fault proves
/// nothing.
pub fn signal(pid: u32, signal: Signal) {
    let status = Command::new("kill")
        .args([format!("-{}", signal.name()), pid.to_string()])
        .status()
        .expect("kill(1) must be installed");
    assert!(status.success(), "kill -{} {pid} failed: {status}", signal.name());
}

/// A TCP port on 127.0.0.1 that nothing listened on a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port on 127.0.0.1")
}
