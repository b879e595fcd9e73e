//! A private Redis Cluster for one test: masters and replicas on free loopback ports,
//! joined by `redis-cli --cluster create`, killed with the test. Node timeout 1 s, so
//! a killed master's replica is promoted within a few seconds.

use std::process::Command;
use std::time::{Duration, Instant};

use super::RedisServer;

/// How long the cluster may take to serve every slot once created.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// A Redis Cluster of this test: three masters and three replicas.
pub struct RedisCluster {
    /// Its nodes, masters first.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `masters` masters with `replicas` replicas each, serving all 16384 slots.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        RedisCluster::start_with(masters, replicas, &[])
    }

    /// As [`RedisCluster::start`], each node started with the arguments `extra`.
    pub fn start_with(masters: usize, replicas: usize, extra: &[&str]) -> RedisCluster {
        let extra: Vec<String> = extra.iter().map(|arg| arg.to_string()).collect();
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| RedisServer::start_node_with(extra.clone()))
            .collect();
        let cluster = RedisCluster { nodes };
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        let output = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|err| panic!("cannot run redis-cli (is it installed?): {err}"));
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        cluster.wait_ok(cluster.nodes.len());
        cluster
    }

    /// Waits until every live node sees `known` nodes and every slot served, and
    /// every replica is in sync with its master.
    pub fn wait_ok(&self, known: usize) {
        let deadline = Instant::now() + READY_WITHIN;
        for node in self.live() {
            loop {
                let info = node
                    .try_query::<String>(redis::cmd("CLUSTER").arg("INFO"))
                    .unwrap_or_default();
                // A replica that never synced cannot be promoted.
                let replication = node
                    .try_query::<String>(redis::cmd("INFO").arg("replication"))
                    .unwrap_or_default();
                let synced = replication.contains("role:master")
                    || replication.contains("master_link_status:up");
                if info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && info.contains(&format!("cluster_known_nodes:{known}\r"))
                    && synced
                {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the cluster was not ok within {READY_WITHIN:?}:\n{info}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The nodes still running.
    pub fn live(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|node| node.child.is_some())
    }

    /// The seed URLs for `[store] cluster`.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(|node| node.url()).collect()
    }

    /// `cluster = [...]` for a config.
    pub fn seeds_toml(&self) -> String {
        let seeds: Vec<String> = self
            .seeds()
            .iter()
            .map(|url| format!("\"{url}\""))
            .collect();
        format!("cluster = [{}]", seeds.join(", "))
    }

    /// The indexes of the nodes that are masters now, as a live node sees it.
    pub fn masters(&self) -> Vec<usize> {
        let node = self.live().next().expect("a live node");
        let nodes: String = node.query(redis::cmd("CLUSTER").arg("NODES"));
        let mut masters: Vec<usize> = nodes
            .lines()
            .filter(|line| {
                let flags = line.split(' ').nth(2).unwrap_or("");
                flags.contains("master") && !flags.contains("fail")
            })
            .filter_map(|line| {
                let port: u16 = line
                    .split(' ')
                    .nth(1)?
                    .split([':', '@'])
                    .nth(1)?
                    .parse()
                    .ok()?;
                self.nodes.iter().position(|n| n.port() == port)
            })
            .collect();
        masters.sort();
        masters
    }

    /// The index of the master serving `slot`.
    pub fn master_of_slot(&self, slot: u16) -> usize {
        let node = self.live().next().expect("a live node");
        let slots: Vec<redis::Value> = node.query(redis::cmd("CLUSTER").arg("SLOTS"));
        for range in slots {
            let redis::Value::Array(fields) = range else {
                continue;
            };
            let number = |v: &redis::Value| match v {
                redis::Value::Int(n) => *n,
                _ => -1,
            };
            let (first, last) = (number(&fields[0]), number(&fields[1]));
            if (first..=last).contains(&i64::from(slot))
                && let redis::Value::Array(master) = &fields[2]
            {
                let port = number(&master[1]) as u16;
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port() == port)
                    .expect("a node of this cluster");
            }
        }
        panic!("no master serves slot {slot}");
    }

    /// The slot of `key`, as the cluster hashes it.
    pub fn slot(&self, key: &str) -> u16 {
        let node = self.live().next().expect("a live node");
        node.query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
    }

    /// `CLUSTER NODES` as a live node sees it (for failure messages).
    pub fn nodes_text(&self) -> String {
        let node = self.live().next().expect("a live node");
        node.try_query::<String>(redis::cmd("CLUSTER").arg("NODES"))
            .unwrap_or_else(|err| err.to_string())
    }

    /// The cluster's node ID of node `i`.
    pub fn id(&self, i: usize) -> String {
        self.nodes[i].query(redis::cmd("CLUSTER").arg("MYID"))
    }
}
