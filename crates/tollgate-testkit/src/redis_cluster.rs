//! [`RedisCluster`]: a real Redis Cluster of several `redis-server`s, for tests of hash tags and
//! routing.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::RedisServer;

/// A Redis Cluster of `n` masters (no replicas) on free ports of 127.0.0.1, its slots spread
/// over all of them; every node is killed when dropped.
///
/// ```no_run
/// let cluster = tollgate_testkit::RedisCluster::start(3);
/// let urls = cluster.urls();
/// assert_eq!(urls.len(), 3);
/// let keys: u64 = cluster.nodes()[0].cli(&["DBSIZE"]).parse().unwrap();
/// # let _ = keys;
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `n` nodes (at least 3, as `redis-cli --cluster create` demands), joins them and
    /// waits until the cluster answers (`cluster_state:ok` on every node).
    pub fn start(n: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..n.max(3))
            .map(|_| RedisServer::start_with(&["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]))
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli must be installed (.ci/run installs it)");
        assert!(out.status.success(), "cluster create failed: {}", String::from_utf8_lossy(&out.stdout));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !nodes.iter().all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")) {
            assert!(Instant::now() < deadline, "the cluster did not become ready within 20 s");
            std::thread::yield_now();
        }
        RedisCluster { nodes }
    }

    /// Every node's URL (`redis://127.0.0.1:<port>/`): any of them reaches the cluster.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes, e.g. to count the keys on each (`DBSIZE`).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }
}
