//! Watching files: the one watcher of the config (and the files it reads) and of the
//! TLS certificates.
//!
//! What is watched says which files it reads ([`Watched::files`], asked again after
//! every check, as a reload may name others) and looks at them again when they may
//! have changed ([`Watched::check`]); this module only says when. It sees editors
//! that write in place, editors that write a new file and rename it over the old
//! one, and a symlink that is repointed (Kubernetes ConfigMap style): it watches each
//! file's directory and the directory of its symlink's target, and also polls, in
//! case no event arrives.
//!
//! A file renamed into place is looked at at once (an atomic rename is complete); one
//! written in place once it has not changed for [`QUIET`]. A check runs on a thread
//! of its own, so a slow one (a million consumers' config) holds up no runtime.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};

/// Events are collected this long before the files are read: the burst of one save
/// (an atomic rename's events arrive together; a file written in place waits for
/// [`QUIET`] besides). Every millisecond here is one a disabled key still works.
const SETTLE: Duration = Duration::from_millis(20);
/// A file changed more recently than this may still be being written: a writer
/// that rewrites it in place, in several writes, would otherwise have a valid prefix
/// of the new file read for a moment. (An atomic rename never is.)
const QUIET: Duration = Duration::from_millis(500);

/// Files to watch, and what to do when they may have changed.
pub(crate) trait Watched: Send + Sync + 'static {
    /// The files, as they stand now.
    fn files(&self) -> Vec<PathBuf>;

    /// Looks at the files again: they may have changed (or not: a poll, an event
    /// about another file of the directory).
    fn check(&self);
}

/// Watches `watched`'s files until the task is dropped, polling every `poll_every`
/// besides; `what` names them in the log.
pub(crate) async fn watch(watched: Arc<dyn Watched>, poll_every: Duration, what: &'static str) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let files = Arc::new(parking_lot::Mutex::new(watched.files()));
    let seen = files.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Reads (ours included: every check reads the files) are not changes.
        if let Ok(event) = event
            && !matches!(event.kind, notify::EventKind::Access(_))
            && concerns(&event, &seen.lock())
        {
            let _ = tx.send(event);
        }
    });
    let mut watcher = match watcher {
        Ok(watcher) => Some(watcher),
        Err(err) => {
            tracing::warn!(error = %err, "cannot watch the {what} files; polling only");
            None
        }
    };
    let mut watching = Vec::new();
    let mut poll = tokio::time::interval(poll_every);
    loop {
        // The directories of the files as they stand (their events come without
        // waiting for the poll).
        if let Some(watcher) = watcher.as_mut() {
            let dirs = files.lock().iter().flat_map(|f| watched_dirs(f)).collect();
            watch_dirs(watcher, &mut watching, dirs, what);
        }
        let events = next_events(&mut rx, &mut poll).await;
        let Some(events) = events else { break };
        // A file renamed into place is complete; any other may still be written.
        let now = files.lock().clone();
        for file in &now {
            if !renamed_into_place(&events, file) {
                wait_until_quiet(file).await;
            }
        }
        check_apart(&watched, what).await;
        *files.lock() = watched.files();
    }
}

/// Watches each of `dirs` not watched yet.
fn watch_dirs(
    watcher: &mut impl Watcher,
    watching: &mut Vec<PathBuf>,
    dirs: Vec<PathBuf>,
    what: &str,
) {
    for dir in dirs {
        if watching.contains(&dir) {
            continue;
        }
        if let Err(err) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
            tracing::warn!(dir = %dir.display(), error = %err, "cannot watch a {what} directory; polling it");
        }
        watching.push(dir);
    }
}

/// The events of the next burst (empty for a poll); `None` once the watcher is gone.
async fn next_events(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<notify::Event>,
    poll: &mut tokio::time::Interval,
) -> Option<Vec<notify::Event>> {
    let mut events = Vec::new();
    tokio::select! {
        event = rx.recv() => {
            events.push(event?);
            tokio::time::sleep(SETTLE).await;
            while let Ok(event) = rx.try_recv() {
                events.push(event);
            }
        }
        _ = poll.tick() => {}
    }
    Some(events)
}

/// Runs `watched`'s check on a thread of its own, at the workers' priority: a lower
/// one (nice 10) made a million consumers' compile 5-8 times slower on a busy machine
/// (13-19 s against 88-104 s of wall time for 1.3 s of CPU), and a disabled key must
/// not keep working that long.
async fn check_apart(watched: &Arc<dyn Watched>, what: &str) {
    let watched = watched.clone();
    let (done, finished) = tokio::sync::oneshot::channel();
    let check = move || {
        watched.check();
        let _ = done.send(());
    };
    let thread = std::thread::Builder::new().name(format!("{what} reload"));
    if thread.spawn(check).is_ok() {
        let _ = finished.await;
    }
}

/// Whether `event` may concern one of `files`: it names one of them (by file name, in
/// whichever watched directory), names something that is not a regular file (a
/// directory, the symlink a ConfigMap repoints, a path already gone), or names
/// nothing (the watcher lost events and asks for a rescan). A regular file of another
/// name written beside them, such as an access log kept next to `gateway.toml` or an
/// editor's swap file, is not: each of its writes would otherwise start a check (a
/// thread, and the files read again) every [`SETTLE`].
fn concerns(event: &notify::Event, files: &[PathBuf]) -> bool {
    if event.paths.is_empty() || event.need_rescan() {
        return true;
    }
    let names: Vec<_> = files.iter().filter_map(|f| f.file_name()).collect();
    event.paths.iter().any(|path| {
        path.file_name().is_none_or(|name| names.contains(&name))
            || !std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_file())
    })
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

/// Whether `a` and `b` name the same entry of the same directory (an event's path is
/// its watched directory joined with the name; the file's, as written).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: notify::EventKind, paths: &[&Path]) -> notify::Event {
        let add = |event: notify::Event, path: &&Path| event.add_path(path.to_path_buf());
        paths.iter().fold(notify::Event::new(kind), add)
    }

    #[test]
    fn only_events_that_may_concern_the_watched_files_wake_the_watcher() {
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
        let files = [config, read[0].clone()];
        let concerned = |kind, paths: &[PathBuf]| {
            let paths: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
            concerns(&event(kind, &paths), &files)
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
}
