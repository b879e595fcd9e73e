//! A private `redis-server` for one test: started on a free loopback port, killed,
//! paused (SIGSTOP), resumed (SIGCONT) and restarted on the same port at will, and
//! always killed when dropped. Nothing here ever talks to a Redis the test did not
//! start (port 6379 is never used).
//!
//! `redis-server` must be installed: a missing binary fails the test with a clear
//! message (CI installs it) rather than skipping it. Every wait is bounded.

pub mod cluster;
pub mod sentinel;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a starting redis-server may take to answer PING.
const READY_WITHIN: Duration = Duration::from_secs(10);
/// Connect, read and write timeout of the test's own Redis commands.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// The key sluice keeps beside its counters to notice their loss (`store::redis::reset`).
pub const MARKER: &str = "sluice:epoch";

/// A `redis-server` process of this test, killed when dropped.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    cluster: bool,
    /// A node of a cluster made by `redis-cli --cluster create`: no slots of its own
    /// at start.
    node: bool,
    /// Further arguments (`--replicaof`, a sentinel's config file).
    extra: Vec<String>,
    paused: bool,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// A standalone redis-server on a free loopback port, answering PING.
    pub fn start() -> RedisServer {
        RedisServer::start_with(false)
    }

    /// A one-node Redis Cluster (all 16384 slots on this node), so that Redis itself
    /// refuses a command or script whose keys are not in one slot (CROSSSLOT).
    pub fn start_cluster() -> RedisServer {
        RedisServer::start_with(true)
    }

    /// A node for a multi-node cluster: cluster mode, no slots, a 1 s node timeout
    /// (failures are detected and replicas promoted within a few seconds).
    pub fn start_node() -> RedisServer {
        RedisServer::start_full(true, true, Vec::new())
    }

    /// A node for a multi-node cluster, with further arguments (e.g.
    /// `--cluster-require-full-coverage no`).
    pub fn start_node_with(extra: Vec<String>) -> RedisServer {
        RedisServer::start_full(true, true, extra)
    }

    /// A standalone server with further arguments.
    pub fn start_args(extra: Vec<String>) -> RedisServer {
        RedisServer::start_full(false, false, extra)
    }

    fn start_with(cluster: bool) -> RedisServer {
        RedisServer::start_full(cluster, false, Vec::new())
    }

    fn start_full(cluster: bool, node: bool, extra: Vec<String>) -> RedisServer {
        let mut server = RedisServer {
            port: 0,
            child: None,
            cluster,
            node,
            extra,
            paused: false,
            dir: tempfile::tempdir().expect("a temporary directory for redis-server"),
        };
        // Another process may take the port between probing and binding it: try
        // a few fresh ports before giving up.
        let mut errors = Vec::new();
        for _ in 0..5 {
            // Below the ephemeral range: while the server is killed, its port must
            // not be handed to somebody's outgoing connection, or it could not be
            // restarted on the same port.
            server.port = super::free_port();
            match server.spawn() {
                Ok(()) => return server,
                Err(err) => errors.push(format!("port {}: {err}", server.port)),
            }
        }
        panic!("redis-server did not start:\n{}", errors.join("\n"));
    }

    /// Its loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/0`, for `[store] url`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Its process id; panics if it is not running.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("redis-server is not running")
            .id()
    }

    /// The server's own temporary directory.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join(format!("redis-{}.log", self.port))
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn spawn(&mut self) -> Result<(), String> {
        let port = self.port.to_string();
        let mut command = Command::new("redis-server");
        // A sentinel's config file must come first.
        command.args(&self.extra);
        command
            .args(["--port", &port, "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            // A replica syncs at once (the default waits 5 s for more replicas).
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.cluster {
            command
                .args(["--cluster-enabled", "yes", "--cluster-config-file"])
                .arg(self.dir.path().join(format!("nodes-{port}.conf")));
        }
        if self.node {
            command.args(["--cluster-node-timeout", "1000"]);
        }
        let child = match command.spawn() {
            Ok(child) => child,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => panic!(
                "`redis-server` is not installed or not on PATH: the Redis store tests need \
                 it (e.g. `apt-get install redis-server`); they do not skip without it ({err})"
            ),
            Err(err) => panic!("cannot run redis-server: {err}"),
        };
        self.child = Some(child);
        self.paused = false;
        let ready = self.wait_ready();
        if ready.is_err() {
            self.kill();
        }
        ready
    }

    /// Waits until the server answers PING (and, for a cluster, serves every slot).
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(format!(
                    "redis-server exited ({status}); log:\n{}",
                    self.log()
                ));
            }
            if self.try_query::<String>(&redis::cmd("PING")).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "redis-server did not answer PING within {READY_WITHIN:?}; log:\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if !self.cluster || self.node {
            return Ok(());
        }
        // On a restart the slots are already ours (nodes.conf): the error is fine.
        let _ = self.try_query::<redis::Value>(
            redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(0).arg(16383),
        );
        loop {
            let info = self
                .try_query::<String>(redis::cmd("CLUSTER").arg("INFO"))
                .unwrap_or_default();
            if info.contains("cluster_state:ok") {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the one-node cluster did not become ok within {READY_WITHIN:?}: {info}"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (SIGKILL) and waits for it to exit. Its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// Starts the server again on the same port (empty: nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        // The port was just released; give the kernel a few tries.
        let mut errors = Vec::new();
        for _ in 0..5 {
            match self.spawn() {
                Ok(()) => return,
                Err(err) => {
                    errors.push(err);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        panic!(
            "redis-server did not restart on port {}:\n{}",
            self.port,
            errors.join("\n")
        );
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&mut self) {
        signal(self.pid(), "-STOP");
        self.paused = true;
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&mut self) {
        signal(self.pid(), "-CONT");
        self.paused = false;
    }

    fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        let connection = client.get_connection_with_timeout(COMMAND_TIMEOUT)?;
        connection.set_read_timeout(Some(COMMAND_TIMEOUT))?;
        connection.set_write_timeout(Some(COMMAND_TIMEOUT))?;
        Ok(connection)
    }

    fn try_query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> redis::RedisResult<T> {
        command.query(&mut self.connection()?)
    }

    /// Runs one command on a fresh connection; panics on any error.
    pub fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> T {
        assert!(!self.paused, "querying a paused redis-server would block");
        self.try_query(command)
            .unwrap_or_else(|err| panic!("redis command {command:?} failed: {err}"))
    }

    /// Every key, as `redis-cli --scan` lists them, but sluice's reset markers
    /// (`sluice:epoch`, and a Cluster master's `sluice:epoch:{n}`, which stand beside
    /// the counters to notice their loss).
    pub fn keys(&self) -> Vec<String> {
        let mut keys = self.all_keys();
        keys.retain(|key| key != MARKER && !key.starts_with("sluice:epoch:{"));
        keys
    }

    /// Every key, the reset marker too.
    pub fn all_keys(&self) -> Vec<String> {
        let mut connection = self
            .connection()
            .unwrap_or_else(|err| panic!("cannot connect to redis-server: {err}"));
        let mut keys = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query(&mut connection)
                .unwrap_or_else(|err| panic!("SCAN failed: {err}"));
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// `FLUSHALL`: the data gone, as an operator's mistake or a script would do it.
    pub fn flushall(&self) {
        let _: String = self.query(&redis::cmd("FLUSHALL"));
    }

    /// `PTTL key`: ms to live, -1 without a TTL, -2 if the key does not exist.
    pub fn pttl(&self, key: &str) -> i64 {
        self.query(redis::cmd("PTTL").arg(key))
    }

    /// Forgets every loaded Lua script (the next EVALSHA gets NOSCRIPT).
    pub fn script_flush(&self) {
        let _: String = self.query(redis::cmd("SCRIPT").arg("FLUSH"));
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.paused
            && let Some(child) = &self.child
        {
            signal(child.id(), "-CONT");
        }
        self.kill();
    }
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap_or_else(|err| panic!("cannot run kill {signal} {pid}: {err}"));
    assert!(status.success(), "kill {signal} {pid} failed: {status}");
}
