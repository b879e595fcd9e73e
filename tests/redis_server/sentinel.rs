//! A private Sentinel setup for one test: a master, a replica and three sentinels on
//! free loopback ports. The sentinels call a master down after 1 s of silence (two of
//! three must agree) and promote the replica.

use std::time::{Duration, Instant};

use super::RedisServer;

/// The name the sentinels monitor the master under.
pub(crate) const MASTER: &str = "sluice-test";

pub(crate) struct RedisSentinels {
    pub(crate) master: RedisServer,
    pub(crate) replica: RedisServer,
    pub(crate) sentinels: Vec<RedisServer>,
    _configs: tempfile::TempDir,
}

impl RedisSentinels {
    pub(crate) fn start() -> RedisSentinels {
        let master = RedisServer::start();
        let replica = RedisServer::start_args(vec![
            "--replicaof".to_string(),
            "127.0.0.1".to_string(),
            master.port().to_string(),
        ]);
        let configs = tempfile::tempdir().expect("a directory for sentinel configs");
        let sentinels = (0..3)
            .map(|i| {
                let path = configs.path().join(format!("sentinel-{i}.conf"));
                std::fs::write(
                    &path,
                    format!(
                        "sentinel monitor {MASTER} 127.0.0.1 {port} 2\n\
                         sentinel down-after-milliseconds {MASTER} 1000\n\
                         sentinel failover-timeout {MASTER} 5000\n\
                         sentinel parallel-syncs {MASTER} 1\n",
                        port = master.port()
                    ),
                )
                .expect("a sentinel config");
                RedisServer::start_args(vec![
                    path.to_string_lossy().into_owned(),
                    "--sentinel".to_string(),
                ])
            })
            .collect();
        let setup = RedisSentinels {
            master,
            replica,
            sentinels,
            _configs: configs,
        };
        setup.wait_replicated();
        setup
    }

    /// Waits until the replica is in sync and every sentinel knows it and the others.
    fn wait_replicated(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info: String = self
                .master
                .try_query(redis::cmd("INFO").arg("replication"))
                .unwrap_or_default();
            let known = self.sentinels.iter().all(|s| {
                let master: Vec<(String, String)> = s
                    .try_query::<Vec<String>>(redis::cmd("SENTINEL").arg("MASTER").arg(MASTER))
                    .unwrap_or_default()
                    .chunks_exact(2)
                    .map(|kv| (kv[0].clone(), kv[1].clone()))
                    .collect();
                let field = |name: &str| {
                    master
                        .iter()
                        .find(|(k, _)| k == name)
                        .map(|(_, v)| v.clone())
                };
                field("num-slaves").as_deref() == Some("1")
                    && field("num-other-sentinels").as_deref() == Some("2")
            });
            if info.contains("connected_slaves:1") && info.contains("state=online") && known {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not see the replica and each other within 20 s: {info}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `sentinel = { master, nodes }` for a config.
    pub(crate) fn sentinel_toml(&self) -> String {
        let nodes: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("\"redis://127.0.0.1:{}\"", s.port()))
            .collect();
        format!(
            "sentinel = {{ master = \"{MASTER}\", nodes = [{}] }}",
            nodes.join(", ")
        )
    }

    /// The master's port, as the first answering sentinel names it.
    pub(crate) fn named_master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let named: Vec<String> = s
                .try_query(
                    redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(MASTER),
                )
                .ok()?;
            named.get(1)?.parse().ok()
        })
    }
}
