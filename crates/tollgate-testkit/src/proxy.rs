//! [`FaultProxy`]: a TCP proxy a test puts between clients and a server, to inject network faults.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;

/// What the proxy does to the traffic it carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    /// Bytes pass as they come.
    #[default]
    Healthy,
    /// Every chunk, in each direction, is held `fixed` plus a uniform random part of `jitter`
    /// (a one-way delay, as `tc netem delay` adds; a round trip pays it twice). Order is kept.
    Latency {
        /// Delay every chunk pays.
        fixed: Duration,
        /// Upper bound of the random extra delay.
        jitter: Duration,
    },
    /// A partition: connections are accepted and bytes are read no further, so nothing is
    /// answered; bytes already read are held and delivered when the fault heals, as TCP would
    /// deliver them when a partition ends before it gives up.
    Blackhole,
}

/// A TCP proxy on 127.0.0.1 that forwards to `upstream` and injects [`Fault`]s, switched while
/// the test runs; [`FaultProxy::reset`] resets every open connection. Stops when dropped.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> std::io::Result<()> {
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let upstream = echo.local_addr()?;
/// tokio::spawn(async move {
///     while let Ok((mut s, _)) = echo.accept().await {
///         tokio::spawn(async move { let (mut r, mut w) = s.split(); tokio::io::copy(&mut r, &mut w).await });
///     }
/// });
/// let proxy = tollgate_testkit::FaultProxy::start(upstream, 7).await?;
/// let mut client = tokio::net::TcpStream::connect(proxy.addr()).await?;
/// client.write_all(b"ping").await?;
/// let mut buf = [0; 4];
/// client.read_exact(&mut buf).await?;
/// assert_eq!(&buf, b"ping");
/// proxy.set(tollgate_testkit::Fault::Blackhole);
/// client.write_all(b"lost?").await?;
/// let late = tokio::time::timeout(std::time::Duration::from_millis(50), client.read(&mut buf)).await;
/// assert!(late.is_err(), "a blackhole answers nothing");
/// proxy.heal();
/// client.read_exact(&mut buf).await?; // held, then delivered
/// assert_eq!(&buf, b"lost");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    connections: Arc<Mutex<JoinSet<()>>>,
    accept: AbortHandle,
}

impl FaultProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`. `seed` drives the jitter,
    /// so a run can be repeated.
    pub async fn start(upstream: SocketAddr, seed: u64) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (fault, _) = watch::channel(Fault::Healthy);
        let connections = Arc::new(Mutex::new(JoinSet::new()));
        let (faults, conns) = (fault.clone(), connections.clone());
        let accept = tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(seed);
            while let Ok((client, _)) = listener.accept().await {
                let _ = client.set_nodelay(true);
                let pipe = pipe(client, upstream, faults.subscribe(), SmallRng::seed_from_u64(rng.random()));
                let mut set = conns.lock().unwrap_or_else(|e| e.into_inner());
                while set.try_join_next().is_some() {}
                set.spawn(pipe);
            }
        })
        .abort_handle();
        Ok(FaultProxy { addr, fault, connections, accept })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://<addr>/`, for a Redis behind the proxy.
    pub fn redis_url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// Switches the fault; connections open now and later follow it.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Ends every fault ([`Fault::Healthy`]).
    pub fn heal(&self) {
        self.set(Fault::Healthy);
    }

    /// Resets every open connection (RST to both ends), as a middlebox or a restart would; new
    /// connections are accepted as before.
    pub fn reset(&self) {
        self.connections.lock().unwrap_or_else(|e| e.into_inner()).abort_all();
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        let mut set = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        while set.try_join_next().is_some() {}
        set.len()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.reset();
    }
}

/// One client connection: both directions, until either side closes or the proxy resets it.
async fn pipe(client: TcpStream, upstream: SocketAddr, mut fault: watch::Receiver<Fault>, rng: SmallRng) {
    // A connection made during a partition waits for the partition to end.
    if passable(&mut fault).await.is_none() {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else { return reset(client) };
    let _ = server.set_nodelay(true);
    let (from_client, to_client) = client.into_split();
    let (from_server, to_server) = server.into_split();
    let rng = Arc::new(Mutex::new(rng));
    let mut up = Box::pin(forward(from_client, to_server, fault.clone(), rng.clone()));
    let mut down = Box::pin(forward(from_server, to_client, fault, rng));
    // Dropping the halves when aborted (a reset) closes both sockets with RST (linger 0).
    tokio::select! {
        _ = &mut up => { let _ = down.await; }
        _ = &mut down => { let _ = up.await; }
    }
}

fn reset(client: TcpStream) {
    let _ = client.set_zero_linger();
}

/// Waits until the fault lets bytes through; `None` when the proxy is gone.
async fn passable(fault: &mut watch::Receiver<Fault>) -> Option<Fault> {
    fault.wait_for(|f| *f != Fault::Blackhole).await.ok().map(|f| *f)
}

/// One direction: a reader that stamps each chunk with its delivery time and a writer that
/// delivers at that time, so latency delays bytes without slowing a pipelined stream.
async fn forward(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
    rng: Arc<Mutex<SmallRng>>,
) {
    let _ = from.as_ref().set_zero_linger();
    let _ = to.as_ref().set_zero_linger();
    let (chunks, mut queue) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut writer_fault = fault.clone();
    let writer = async move {
        while let Some((at, chunk)) = queue.recv().await {
            tokio::time::sleep_until(at).await;
            // Held while a partition lasts.
            if passable(&mut writer_fault).await.is_none() || to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        let mut last = Instant::now();
        loop {
            let Some(now) = passable(&mut fault).await else { return };
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let delay = match now {
                Fault::Latency { fixed, jitter } if jitter.is_zero() => fixed,
                Fault::Latency { fixed, jitter } => {
                    let extra =
                        rng.lock().unwrap_or_else(|e| e.into_inner()).random_range(0..=jitter.as_nanos() as u64);
                    fixed + Duration::from_nanos(extra)
                }
                _ => Duration::ZERO,
            };
            // Never before an earlier chunk: order is kept, as on one TCP stream.
            last = last.max(Instant::now() + delay);
            if chunks.send((last, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    tokio::join!(reader, writer);
}
