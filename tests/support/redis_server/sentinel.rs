//! A private Sentinel setup for one test: a master, a replica and three sentinels on
//! free loopback ports. The sentinels call a master down after 1 s of silence (two of
//! three must agree) and promote the replica.

use std::time::{Duration, Instant};

use super::RedisServer;

/// The name the sentinels monitor the master under.
pub const MASTER: &str = "sluice-test";

/// A master, its replica and three sentinels watching it, all of this test.
pub struct RedisSentinels {
    /// The master at start (sentinels may promote the replica).
    pub master: RedisServer,
    /// The master's replica.
    pub replica: RedisServer,
    /// Three sentinels watching [`MASTER`].
    pub sentinels: Vec<RedisServer>,
    /// The TLS ports, for a setup started with [`RedisSentinels::start_tls`].
    pub tls_ports: TlsPorts,
    _configs: tempfile::TempDir,
}

/// The TLS port of each server of a setup that speaks TLS.
pub struct TlsPorts {
    /// The master's TLS port.
    pub master: Option<u16>,
    /// Each sentinel's TLS port.
    pub sentinels: Vec<u16>,
}

/// A private CA and one certificate it signed for `localhost` and 127.0.0.1, in
/// PEM files.
struct Tls {
    ca: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

impl Tls {
    fn make(dir: &std::path::Path) -> Tls {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
        // Distinct subjects: OpenSSL (redis-server's replication and the sentinels'
        // links) takes a certificate whose subject is its issuer's for self-signed.
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "sluice test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let cert = params.signed_by(&key, &ca).unwrap();
        let tls = Tls {
            ca: dir.join("ca.pem"),
            cert: dir.join("redis.pem"),
            key: dir.join("redis-key.pem"),
        };
        std::fs::write(&tls.ca, ca.pem()).unwrap();
        std::fs::write(&tls.cert, cert.pem()).unwrap();
        std::fs::write(&tls.key, key.serialize_pem()).unwrap();
        tls
    }

    /// redis-server's arguments for TLS on `port`, replication over TLS too, clients
    /// not asked for certificates.
    fn args(&self, port: u16) -> Vec<String> {
        let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
        vec![
            "--tls-port".to_string(),
            port.to_string(),
            "--tls-cert-file".to_string(),
            path(&self.cert),
            "--tls-key-file".to_string(),
            path(&self.key),
            "--tls-ca-cert-file".to_string(),
            path(&self.ca),
            "--tls-auth-clients".to_string(),
            "no".to_string(),
            "--tls-replication".to_string(),
            "yes".to_string(),
        ]
    }
}

impl RedisSentinels {
    /// A master, a replica and three sentinels, on plain TCP.
    pub fn start() -> RedisSentinels {
        let configs = tempfile::tempdir().expect("a directory for sentinel configs");
        RedisSentinels::start_in(configs, None)
    }

    /// The same, every server also speaking TLS on a port of its own with a
    /// certificate for `localhost` and 127.0.0.1 from a private CA (at the returned
    /// path), replication and the sentinels' links over TLS: the sentinels name the
    /// master's TLS port. Each server's plain port stays for the test's own commands.
    pub fn start_tls() -> (RedisSentinels, std::path::PathBuf) {
        let configs = tempfile::tempdir().expect("a directory for sentinel configs");
        let ca = Tls::make(configs.path());
        (RedisSentinels::start_in(configs, Some(&ca)), ca.ca)
    }

    fn start_in(configs: tempfile::TempDir, tls: Option<&Tls>) -> RedisSentinels {
        let tls_port = |args: &mut Vec<String>| -> Option<u16> {
            let tls = tls?;
            let port = super::super::free_port();
            args.extend(tls.args(port));
            Some(port)
        };
        let mut args = Vec::new();
        let master_tls = tls_port(&mut args);
        let master = RedisServer::start_args(args);
        let monitored = master_tls.unwrap_or(master.port());
        let mut args = vec![
            "--replicaof".to_string(),
            "127.0.0.1".to_string(),
            monitored.to_string(),
        ];
        tls_port(&mut args);
        let replica = RedisServer::start_args(args);
        let sentinels = (0..3)
            .map(|i| {
                let path = configs.path().join(format!("sentinel-{i}.conf"));
                std::fs::write(
                    &path,
                    format!(
                        "sentinel monitor {MASTER} 127.0.0.1 {monitored} 2\n\
                         sentinel down-after-milliseconds {MASTER} 1000\n\
                         sentinel failover-timeout {MASTER} 5000\n\
                         sentinel parallel-syncs {MASTER} 1\n"
                    ),
                )
                .expect("a sentinel config");
                let mut args = vec![
                    path.to_string_lossy().into_owned(),
                    "--sentinel".to_string(),
                ];
                let port = tls_port(&mut args);
                (RedisServer::start_args(args), port)
            })
            .collect::<Vec<_>>();
        let sentinel_tls_ports = sentinels.iter().filter_map(|(_, port)| *port).collect();
        let setup = RedisSentinels {
            master,
            replica,
            sentinels: sentinels.into_iter().map(|(s, _)| s).collect(),
            tls_ports: TlsPorts {
                master: master_tls,
                sentinels: sentinel_tls_ports,
            },
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
    pub fn sentinel_toml(&self) -> String {
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

    /// `sentinel = { master, nodes }` for a config, through the sentinels' TLS ports
    /// by the name `localhost`.
    pub fn sentinel_tls_toml(&self) -> String {
        let nodes: Vec<String> = self
            .tls_ports
            .sentinels
            .iter()
            .map(|port| format!("\"rediss://localhost:{port}\""))
            .collect();
        format!(
            "sentinel = {{ master = \"{MASTER}\", nodes = [{}] }}",
            nodes.join(", ")
        )
    }

    /// The master's port, as the first answering sentinel names it.
    pub fn named_master_port(&self) -> Option<u16> {
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
