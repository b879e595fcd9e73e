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
//! The watcher sees editors that write in place, editors that write a new file and
//! rename it over the old one, and a symlink that is repointed (Kubernetes ConfigMap
//! style): it watches the file's directory and the directory of the symlink's
//! target, and also polls every second, and reloads when the file's bytes change.
//! The config's `consumers_file` and `[identity.jwt] keys` files are part of the
//! config: a change to their bytes reloads the config too, their directories are
//! watched as well, so a disabled or removed key is refused within a second.
//!
//! A file renamed into place is read at once (an atomic rename is complete); one
//! written in place is read once it has not changed for [`QUIET`]. The watcher
//! compiles on a thread of its own, and the snapshot a reload replaces is freed on a thread of its own once the requests
//! that hold it are done, so a million consumers' swap costs requests little.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use parking_lot::Mutex;
use xxhash_rust::xxh3::Xxh3Default;

use crate::config::{Config, ConfigError, Diagnostic, Severity};
use crate::gateway::Gateway;

/// How often the file is polled in case no change event arrives.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// Events are collected this long before the file is read: the burst of one save
/// (an atomic rename's events arrive together; a file written in place waits for
/// [`QUIET`] besides). Every millisecond here is one a disabled key still works.
const SETTLE: Duration = Duration::from_millis(20);
/// A file changed more recently than this may still be being written: a writer
/// that rewrites it in place, in several writes, would otherwise have a valid TOML
/// prefix of the new file served for a moment. (An atomic rename never is.)
const QUIET: Duration = Duration::from_millis(500);

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
        tracing::info!(generation, file = %self.path.display(), "config reloaded");
        Ok(Reloaded {
            generation,
            restart_only,
        })
    }

    /// Reloads if the file's bytes differ from the last ones compiled.
    fn reload_if_changed(&self) {
        let Some(digest) = self.digest() else {
            return;
        };
        if *self.last_seen.lock() != digest {
            let _ = self.reload();
        }
    }

    /// Watches the file until the task is dropped.
    pub(crate) async fn watch(self: Arc<Self>) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let this = self.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // Reads (ours included: every check reads the file) are not changes.
            if let Ok(event) = event
                && !matches!(event.kind, notify::EventKind::Access(_))
                && concerns(&event, &this.path, &this.watched.lock())
            {
                let _ = tx.send(event);
            }
        });
        let mut watcher = match watcher {
            Ok(watcher) => Some(watcher),
            Err(err) => {
                tracing::warn!(error = %err, "cannot watch the config file; polling only");
                None
            }
        };
        let mut watching = Vec::new();
        let mut poll = tokio::time::interval(POLL_EVERY);
        loop {
            // The directories of the config file and of the files it reads (their
            // events reload without waiting for the poll), as the config in force names them.
            if let Some(watcher) = watcher.as_mut() {
                let files = std::iter::once(self.path.clone()).chain(self.watched.lock().clone());
                for dir in files.flat_map(|file| watched_dirs(&file)) {
                    if watching.contains(&dir) {
                        continue;
                    }
                    if let Err(err) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
                        tracing::warn!(dir = %dir.display(), error = %err, "cannot watch a config directory; polling it");
                    }
                    watching.push(dir);
                }
            }
            let mut events = Vec::new();
            tokio::select! {
                event = rx.recv() => {
                    let Some(event) = event else { break };
                    events.push(event);
                    tokio::time::sleep(SETTLE).await;
                    while let Ok(event) = rx.try_recv() {
                        events.push(event);
                    }
                }
                _ = poll.tick() => {}
            }
            // A file renamed into place is complete; any other may still be written.
            let watched = self.watched.lock().clone();
            for file in std::iter::once(&self.path).chain(&watched) {
                if !renamed_into_place(&events, file) {
                    wait_until_quiet(file).await;
                }
            }
            // On a thread of its own, at the workers' priority: a lower one (nice
            // 10) made a million consumers' compile 5-8 times slower on a busy
            // machine (13-19 s against 88-104 s of wall time for 1.3 s of CPU), and
            // a disabled key must not keep working that long.
            let this = self.clone();
            let (done, finished) = tokio::sync::oneshot::channel();
            let compile = move || {
                this.reload_if_changed();
                let _ = done.send(());
            };
            let thread = std::thread::Builder::new().name("config-reload".to_string());
            if thread.spawn(compile).is_ok() {
                let _ = finished.await;
            }
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

/// Whether `events` say `file` was last put in place by a rename, and not written
/// since: a file renamed over the old one is complete (that is what an atomic
/// rename is for), so it needs no [`QUIET`] wait.
fn renamed_into_place(events: &[notify::Event], file: &Path) -> bool {
    use notify::EventKind;
    use notify::event::{ModifyKind, RenameMode};
    let mut renamed = false;
    for event in events {
        let is_file = |path: Option<&PathBuf>| path.is_some_and(|p| same_file(p, file));
        match event.kind {
            EventKind::Modify(ModifyKind::Name(RenameMode::To)) if is_file(event.paths.first()) => {
                renamed = true;
            }
            // From the first path to the second.
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
                if is_file(event.paths.get(1)) {
                    renamed = true;
                } else if is_file(event.paths.first()) {
                    renamed = false;
                }
            }
            // A change of permissions or times does not write it.
            EventKind::Modify(ModifyKind::Metadata(_)) => {}
            _ if event.paths.iter().any(|p| same_file(p, file)) => renamed = false,
            _ => {}
        }
    }
    renamed
}

/// Whether `event` may concern `config` or the files it reads (`read`): it names
/// one of them (by file name, in whichever watched directory), names something that
/// is not a regular file (a directory, the symlink a ConfigMap repoints, a path
/// already gone), or names nothing (the watcher lost events and asks for a rescan).
/// A regular file of another name written beside them, such as an access log kept
/// next to `gateway.toml` or an editor's swap file, is not: each of its writes would
/// otherwise start a check (a thread, and the config read again) every [`SETTLE`].
fn concerns(event: &notify::Event, config: &Path, read: &[PathBuf]) -> bool {
    if event.paths.is_empty() || event.need_rescan() {
        return true;
    }
    let names = std::iter::once(config).chain(read.iter().map(PathBuf::as_path));
    let names: Vec<_> = names.filter_map(Path::file_name).collect();
    event.paths.iter().any(|path| {
        path.file_name().is_none_or(|name| names.contains(&name))
            || !std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_file())
    })
}

/// Whether `a` and `b` name the same entry of the same directory (an event's path is
/// its watched directory joined with the name; the config's, as written).
fn same_file(a: &Path, b: &Path) -> bool {
    let dir = |p: &Path| std::fs::canonicalize(parent(p)).ok();
    a.file_name() == b.file_name() && dir(a).is_some_and(|d| Some(d) == dir(b))
}

/// The directory `path` is in (`.` for a bare file name).
fn parent(path: &Path) -> PathBuf {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
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

/// Waits until the file has not been modified for [`QUIET`] (at most a few seconds:
/// a file touched without end is read anyway).
async fn wait_until_quiet(path: &Path) {
    for _ in 0..10 {
        let age = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|modified| modified.elapsed().ok());
        match age {
            Some(age) if age < QUIET => tokio::time::sleep(QUIET - age).await,
            _ => return,
        }
    }
}

/// The file's directory, and the directory its symlink points into.
fn watched_dirs(path: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![parent(path)];
    if let Ok(target) = std::fs::canonicalize(path) {
        let dir = parent(&target);
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
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

    fn event(kind: notify::EventKind, paths: &[&Path]) -> notify::Event {
        let add = |event: notify::Event, path: &&Path| event.add_path(path.to_path_buf());
        paths.iter().fold(notify::Event::new(kind), add)
    }

    #[test]
    fn only_events_that_may_concern_the_config_or_its_files_wake_the_watcher() {
        use notify::EventKind::{Create, Modify, Remove};
        use notify::event::{CreateKind, DataChange, ModifyKind, RemoveKind, RenameMode};
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name);
        let config = at("gateway.toml");
        let read = [at("consumers.jsonl")];
        for file in [
            "gateway.toml",
            "consumers.jsonl",
            "access.log",
            ".gateway.toml.swp",
        ] {
            std::fs::write(at(file), "x").unwrap();
        }
        std::fs::create_dir(at("..2026_11_27")).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(at("..2026_11_27"), at("..data")).unwrap();
        let written = Modify(ModifyKind::Data(DataChange::Content));
        let renamed = Modify(ModifyKind::Name(RenameMode::Both));
        let concerned = |kind, paths: &[PathBuf]| {
            let paths: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
            concerns(&event(kind, &paths), &config, &read)
        };
        // Other regular files written beside the config: not a change of it.
        assert!(!concerned(written, &[at("access.log")]));
        assert!(!concerned(written, &[at(".gateway.toml.swp")]));
        assert!(!concerned(Create(CreateKind::File), &[at("access.log")]));
        // The config, a file it reads, a file renamed over either of them.
        assert!(concerned(written, &[at("gateway.toml")]));
        assert!(concerned(written, &[at("consumers.jsonl")]));
        assert!(concerned(
            renamed,
            &[at(".gateway.toml.swp"), at("gateway.toml")]
        ));
        // What is not a regular file, or is gone: a ConfigMap's directories and the
        // symlink it repoints, a removed file.
        assert!(concerned(Create(CreateKind::Folder), &[at("..2026_11_27")]));
        #[cfg(unix)]
        assert!(concerned(renamed, &[at("..data_tmp"), at("..data")]));
        assert!(concerned(Remove(RemoveKind::File), &[at("gone.toml")]));
        // An event that names nothing (lost events): the directory is read again.
        assert!(concerned(written, &[]));
    }

    #[test]
    fn only_a_file_renamed_into_place_and_not_written_since_skips_the_quiet_wait() {
        use notify::EventKind::{Create, Modify};
        use notify::event::{CreateKind, DataChange, MetadataKind, ModifyKind, RenameMode};
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("consumers.jsonl");
        let tmp = dir.path().join("consumers.jsonl.tmp");
        let to = Modify(ModifyKind::Name(RenameMode::To));
        let both = Modify(ModifyKind::Name(RenameMode::Both));
        let from = Modify(ModifyKind::Name(RenameMode::From));
        let written = Modify(ModifyKind::Data(DataChange::Content));
        let touched = Modify(ModifyKind::Metadata(MetadataKind::WriteTime));
        let created = Create(CreateKind::File);
        let renamed = |events: &[notify::Event]| renamed_into_place(events, &file);
        assert!(renamed(&[event(to, &[&file])]));
        assert!(renamed(&[event(both, &[&tmp, &file])]));
        assert!(renamed(&[event(to, &[&file]), event(touched, &[&file])]));
        // The same entry through another spelling of its directory.
        let spelled = dir.path().join(".").join("consumers.jsonl");
        assert!(renamed(&[event(to, &[&spelled])]));
        // Written in place, created anew, written after the rename: maybe partial.
        assert!(!renamed(&[event(written, &[&file])]));
        assert!(!renamed(&[event(created, &[&file])]));
        assert!(!renamed(&[event(to, &[&file]), event(written, &[&file])]));
        // A rename away from it, or of another file, or no event (a poll).
        assert!(!renamed(&[event(both, &[&file, &tmp])]));
        assert!(!renamed(&[event(to, &[&file]), event(from, &[&file])]));
        assert!(!renamed(&[event(to, &[&tmp])]));
        assert!(!renamed(&[]));
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
