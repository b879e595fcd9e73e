//! Reloading `gateway.toml` while serving: on a file change, SIGHUP or
//! `POST /admin/reload`.
//!
//! A reload compiles the file first and swaps the gateway's snapshot only if it is
//! valid; a bad file is rejected whole (every error logged with file, line, key and
//! reason, counted in `sluice_config_reloads_total{result="error"}`) and the old
//! config keeps serving. Counters live in the store, keyed by (policy, plan), so they
//! survive. Settings that need a restart (`[server]`'s start-up settings, listed by
//! [`crate::config::ServerStartup`] itself, `[admin]` and the whole `[store]`
//! section) are reported, in the log and in the `/admin/reload` answer, and keep
//! their running values.
//!
//! The files are watched by the one file watcher (`crate::app::watch`), which asks
//! [`Reloader::files`] what to watch and calls [`Reloader::reload_if_changed`] when
//! they may have changed: the config is reloaded when the bytes of its file differ
//! from the last ones compiled. The config's `consumers_file` and
//! `[identity.jwt] keys` files are part of the config: a change to their bytes
//! reloads the config too, and they are watched as well, so a disabled or removed key
//! is refused within a second. The snapshot a reload replaces is freed on a thread
//! of its own once the requests that hold it are done, so a million consumers' swap
//! costs requests little. This module watches nothing itself.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use xxhash_rust::xxh3::Xxh3Default;

use crate::config::{Config, ConfigError, Diagnostic, Severity};
use crate::gateway::Gateway;

/// A reload that took effect.
#[derive(Debug)]
pub(crate) struct Reloaded {
    /// The generation now serving.
    pub generation: u64,
    /// Settings that changed but keep their running values until a restart.
    pub restart_only: Vec<Diagnostic>,
}

pub(crate) struct Reloader {
    path: PathBuf,
    gateway: Arc<Gateway>,
    /// A digest of the bytes last compiled (good or bad), so a change is compiled
    /// once: the config file's, then the consumers file's of the config in force.
    /// XXH3-128: it tells versions apart and is not a defence against anyone (a
    /// writer of the file decides what it says anyway); at 15 times SHA-256's speed
    /// it takes 5 ms of a million consumers' swap where SHA-256 took 70.
    last_seen: Mutex<u128>,
    /// The files the config in force reads besides itself (consumers, JWT keys).
    watched: Mutex<Vec<PathBuf>>,
    /// The digest of each watched file as last read, with the length, modification
    /// time and inode it had then: a file whose stamp is unchanged is not read
    /// again (a million consumers' file is over 100 MB to hash at every check).
    file_digests: Mutex<HashMap<PathBuf, (Stamp, u128)>>,
    /// The last reload tried (by file change, SIGHUP or the admin API), for the
    /// status page.
    last: Mutex<Option<LastReload>>,
}

/// A reload tried: when, and what came of it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct LastReload {
    /// The gateway clock's ms (wall time) when it was tried.
    pub at_ms: u64,
    /// `ok` or `error`.
    pub result: &'static str,
    /// The generation serving after it.
    pub generation: u64,
    /// Every error of a rejected file, with file, line and key.
    pub errors: Vec<String>,
}

/// What tells a file's versions apart without reading it.
type Stamp = (u64, Option<std::time::SystemTime>, u64);

fn stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Some((meta.len(), meta.modified().ok(), inode))
}

/// The files `config` reads besides itself, whose changes reload it.
fn read_files(config: &Config) -> Vec<PathBuf> {
    let identity = &config.identity;
    let keys = identity.jwt.iter().flat_map(|jwt| jwt.files.iter());
    identity
        .consumers_file
        .iter()
        .chain(keys)
        .cloned()
        .collect()
}

impl Reloader {
    pub(crate) fn new(path: &Path, gateway: Arc<Gateway>) -> Reloader {
        let watched = read_files(gateway.snapshot().config());
        let reloader = Reloader {
            path: path.to_path_buf(),
            gateway,
            last_seen: Mutex::new(0),
            watched: Mutex::new(watched),
            file_digests: Mutex::default(),
            last: Mutex::default(),
        };
        if let Some(digest) = reloader.digest() {
            *reloader.last_seen.lock() = digest;
        }
        reloader
    }

    /// The digest of the config file's bytes and its consumers file's; `None` while
    /// the config file cannot be read or is empty (most likely a writer that
    /// truncated it and has not written yet: an empty config would answer 404 to
    /// everything).
    fn digest(&self) -> Option<u128> {
        let bytes = std::fs::read(&self.path).ok()?;
        if bytes.trim_ascii().is_empty() {
            return None;
        }
        let mut hash = Xxh3Default::new();
        hash.update(&bytes);
        for file in self.watched.lock().iter() {
            hash.update(&[0xff]);
            hash.update(&self.file_digest(file).to_le_bytes());
        }
        Some(hash.digest128())
    }

    /// The digest of `file`'s bytes (of none, if it cannot be read), read again only
    /// when its stamp changed.
    fn file_digest(&self, file: &Path) -> u128 {
        let now = stamp(file);
        let mut known = self.file_digests.lock();
        if let Some((seen, digest)) = known.get(file)
            && now.is_some()
            && Some(*seen) == now
        {
            return *digest;
        }
        // Streamed: a consumers file can be over 100 MB, which the gateway would
        // otherwise hold at once, on top of its consumers.
        let mut hash = Xxh3Default::new();
        let _ = std::fs::File::open(file).and_then(|f| stream(f, &mut hash));
        let digest = hash.digest128();
        match now {
            Some(now) => known.insert(file.to_path_buf(), (now, digest)),
            None => known.remove(file),
        };
        digest
    }

    /// Compiles the file and, if it is valid, serves it from now on.
    pub(crate) fn reload(&self) -> Result<Reloaded, ConfigError> {
        let mut last_seen = self.last_seen.lock();
        if let Some(digest) = self.digest() {
            *last_seen = digest;
        }
        let metrics = self.gateway.metrics();
        let mut config = match Config::load(&self.path) {
            Ok(config) => config,
            Err(err) => {
                for diagnostic in err.errors() {
                    tracing::error!("config reload rejected: {diagnostic}");
                }
                metrics.config_reloads.with_label_values(&["error"]).inc();
                self.tried("error", err.errors().map(|d| d.to_string()).collect());
                return Err(err);
            }
        };
        let running = self.gateway.snapshot();
        let restart_only = restart_only(running.config(), &config);
        keep_running(running.config(), &mut config);
        for warning in restart_only.iter().chain(&config.warnings) {
            tracing::warn!("{warning}");
        }
        let watched = read_files(&config);
        let (generation, previous) = self.gateway.replace(config);
        retire(previous);
        // The new config may read other files: watched from now on.
        if *self.watched.lock() != watched {
            *self.watched.lock() = watched;
            if let Some(digest) = self.digest() {
                *last_seen = digest;
            }
        }
        metrics.config_reloads.with_label_values(&["ok"]).inc();
        self.tried("ok", Vec::new());
        tracing::info!(generation, file = %self.path.display(), "config reloaded");
        Ok(Reloaded {
            generation,
            restart_only,
        })
    }

    /// Remembers the reload just tried.
    fn tried(&self, result: &'static str, errors: Vec<String>) {
        *self.last.lock() = Some(LastReload {
            at_ms: self.gateway.clock().now_ms(),
            result,
            generation: self.gateway.snapshot().generation,
            errors,
        });
    }

    /// The last reload tried, if any was since start.
    pub(crate) fn last(&self) -> Option<LastReload> {
        self.last.lock().clone()
    }

    /// The config file and the files the config in force reads besides it.
    pub(crate) fn files(&self) -> Vec<PathBuf> {
        std::iter::once(self.path.clone())
            .chain(self.watched.lock().iter().cloned())
            .collect()
    }

    /// Reloads if the file's bytes differ from the last ones compiled.
    pub(crate) fn reload_if_changed(&self) {
        let Some(digest) = self.digest() else {
            return;
        };
        if *self.last_seen.lock() != digest {
            let _ = self.reload();
        }
    }
}

/// Frees a replaced snapshot on a thread of its own, once the requests that still
/// hold it are done (at most a minute later: after that, the last of them frees
/// it). A million consumers take tens of milliseconds to free, which neither a
/// request's worker thread nor the reload should pay.
fn retire(previous: Arc<crate::snapshot::Snapshot>) {
    let free = move || {
        let mut previous = previous;
        for _ in 0..6_000 {
            match Arc::try_unwrap(previous) {
                Ok(snapshot) => return drop(snapshot),
                Err(shared) => previous = shared,
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // Without a thread, the snapshot is freed here (the closure is dropped).
    let _ = std::thread::Builder::new()
        .name("snapshot-free".to_string())
        .spawn(free);
}

/// Feeds everything `file` holds to `hash`, 64 KiB at a time.
fn stream(mut file: std::fs::File, hash: &mut Xxh3Default) -> std::io::Result<()> {
    let mut buffer = vec![0; 1 << 16];
    loop {
        match std::io::Read::read(&mut file, &mut buffer)? {
            0 => return Ok(()),
            n => hash.update(&buffer[..n]),
        }
    }
}

/// Gives `new` the running values of the settings that only take effect after a
/// restart, so the snapshot says what runs: a request that reads one (the head
/// check's `max_header_bytes`) agrees with the buffers the listeners were built
/// with, and the next reload is compared with what runs, not with the last file.
fn keep_running(running: &Config, new: &mut Config) {
    new.server.startup = running.server.startup.clone();
    new.admin = running.admin.clone();
    new.store = running.store.clone();
}

/// Warnings for settings that differ but only take effect after a restart.
fn restart_only(running: &Config, new: &Config) -> Vec<Diagnostic> {
    // Every [server] start-up setting, by its key: the list comes from the type.
    let mut changed = running.server.startup.changed(&new.server.startup);
    if running.admin.listen != new.admin.listen || running.admin.token != new.admin.token {
        changed.push("admin");
    }
    let (a, b) = (&running.store, &new.store);
    if a.backend != b.backend {
        // The backend, its url, on_error and timeout: a new store would start empty.
        changed.push("store.backend / url / on_error / timeout");
    }
    if a.state_file != b.state_file {
        changed.push("store.state_file");
    }
    if a.max_keys != b.max_keys {
        changed.push("store.max_keys");
    }
    changed
        .into_iter()
        .map(|key| Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::whole_file(
                &new.file,
                key,
                "changed, but only takes effect after a restart; the running value is kept"
                    .to_string(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::one_change_each;

    fn config() -> Config {
        Config::parse(Path::new("gateway.toml"), "").expect("an empty file compiles")
    }

    fn keys(warnings: &[Diagnostic]) -> Vec<&str> {
        warnings.iter().map(|w| w.key.as_str()).collect()
    }

    /// The list comes from `ServerStartup`: a setting added there is covered here
    /// without a change to this file.
    #[test]
    fn every_changed_startup_setting_is_reported_as_restart_only_by_its_key() {
        let running = config();
        for (key, startup) in one_change_each(&running.server.startup) {
            let mut new = running.clone();
            new.server.startup = startup;
            let warnings = restart_only(&running, &new);
            assert_eq!(keys(&warnings), [key]);
            assert_eq!(warnings[0].severity, Severity::Warning);
            assert!(warnings[0].reason.contains("restart"), "{}", warnings[0]);
        }
    }

    #[test]
    fn changed_live_settings_are_not_restart_only() {
        let running = config();
        let mut new = running.clone();
        let live = &mut new.server.live;
        live.max_uri_bytes += 1;
        live.max_body_bytes += 1;
        live.body_timeout += Duration::from_secs(1);
        live.min_body_rate += 1;
        assert_eq!(keys(&restart_only(&running, &new)), Vec::<&str>::new());
    }

    #[test]
    fn changed_admin_and_store_settings_are_restart_only() {
        let running = config();
        let mut new = running.clone();
        new.admin.token = Some("secret".to_string());
        new.store.max_keys += 1;
        new.store.state_file = Some("counters.state".into());
        assert_eq!(
            keys(&restart_only(&running, &new)),
            ["admin", "store.state_file", "store.max_keys"]
        );
    }

    #[test]
    fn a_restart_only_change_keeps_the_running_value_and_stays_reported() {
        let running = config();
        let mut file = running.clone();
        file.server.startup.max_header_bytes = 1024;
        file.admin.token = Some("secret".to_string());
        file.store.max_keys += 1;
        file.server.live.max_uri_bytes = 100;
        let mut serving = file.clone();
        keep_running(&running, &mut serving);
        // The head check reads the size hyper's buffers were built with ...
        assert_eq!(serving.server.startup.max_header_bytes, 16_384);
        assert_eq!(serving.admin.token, None);
        assert_eq!(serving.store.max_keys, running.store.max_keys);
        // ... the live setting applies ...
        assert_eq!(serving.server.live.max_uri_bytes, 100);
        // ... and the next reload of the same file still reports what needs a restart.
        assert_eq!(
            keys(&restart_only(&serving, &file)),
            ["server.max_header_bytes", "admin", "store.max_keys"]
        );
    }
}
