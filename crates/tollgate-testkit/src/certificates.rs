//! [`Certificates`]: a throwaway PKI for TLS tests, made with the `openssl` command.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::process::free_port;

/// Certificates in a fresh directory (removed when dropped): two CAs, `ca` and `other`, and
/// `server` and `client` certificates signed by `ca`, for 127.0.0.1 and localhost. Each is
/// `NAME.crt` with its key `NAME.key`.
///
/// ```no_run
/// let certs = tollgate_testkit::Certificates::make();
/// let ca = certs.path("ca.crt");
/// # let _ = ca;
/// ```
#[derive(Debug)]
pub struct Certificates {
    /// The directory holding them.
    pub dir: PathBuf,
}

impl Certificates {
    /// Makes the certificates (needs `openssl` on the `PATH`).
    pub fn make() -> Certificates {
        let dir = std::env::temp_dir().join(format!("tollgate-tls-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).expect("a temporary directory for certificates");
        ca(&dir, "ca");
        ca(&dir, "other");
        signed(&dir, "server", "ca");
        signed(&dir, "client", "ca");
        Certificates { dir }
    }

    /// `file` in the directory, as a string for a URL or a command line.
    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// The arguments that give a `redis-server` a TLS port: its certificate is `server`, and it
    /// asks clients for a certificate signed by `ca` if `clients` is true.
    pub fn server_args(&self, tls_port: u16, clients: bool) -> Vec<String> {
        let auth = if clients { "yes" } else { "no" };
        [
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &self.path("server.crt"),
            "--tls-key-file",
            &self.path("server.key"),
            "--tls-ca-cert-file",
            &self.path("ca.crt"),
            "--tls-auth-clients",
            auth,
        ]
        .map(str::to_owned)
        .to_vec()
    }
}

impl Drop for Certificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

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
    std::fs::write(dir.join("ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").expect("openssl's extension file");
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
