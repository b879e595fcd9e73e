//! The memory store's state file: counters that survive a restart or a crash.
//!
//! Every few seconds, and once more at shutdown, the counters are written to
//! `state_file.tmp`, fsynced and renamed over `state_file`, so the file on disk is
//! always a whole snapshot. At start the file is read back; a missing file means a
//! first start, and a corrupt or foreign one (bad magic, version or checksum,
//! malformed counters) is reported and ignored, never a crash. A `kill -9` loses what
//! was counted since the last snapshot: at most [`SAVE_EVERY`] of traffic.
//!
//! Format, little-endian: `SLUICEST`, version `u32`, saved-at ms `u64`, then tables
//! (policy, plan, callers: key `u64` + run words), totals (policy, run words) and bans
//! (key `u64`, until ms `u64`, refusals `u32`, level `u32`, kind `u8` (0 automatic, 1
//! manual), reason, caller), then the SHA-256 of everything before it. Buckets are
//! wall-clock based, so counts restored after a restart expire exactly when they would
//! have, and so do bans. Version 2 files (no bans) and version 1 files (exact logs
//! stored as `(ms, count)` pairs) are still read, and converted.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::MemoryStore;
use crate::limit::{MAX_WORDS, Runs};
use crate::store::bans::{Ban, Reason};

/// How often the counters are written while serving.
pub const SAVE_EVERY: Duration = Duration::from_secs(5);

const MAGIC: &[u8; 8] = b"SLUICEST";
const VERSION: u32 = 3;
/// Tables and totals, no bans.
const VERSION_NO_BANS: u32 = 2;
/// The first layout: every counter entry a `(bucket, count)` pair.
const VERSION_PAIRS: u32 = 1;

/// Why a state file was not used.
#[derive(Debug, thiserror::Error)]
pub(super) enum StateError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} is not a sluice state file (or is corrupt): {reason}")]
    Invalid { path: PathBuf, reason: &'static str },
}

/// What [`restore`] put back.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Restored {
    pub callers: usize,
    pub totals: usize,
    /// Callers left out because `max_keys` was reached.
    pub dropped: usize,
    /// Bans still in force.
    pub bans: usize,
    pub saved_at_ms: u64,
}

/// Writes the store's counters to `path` atomically.
pub(super) fn save(store: &MemoryStore, path: &Path, now_ms: u64) -> io::Result<()> {
    let _saving = store.saving.lock();
    let tmp = path.with_extension("tmp");
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    let mut out = HashingWriter {
        inner: BufWriter::new(file),
        hash: Sha256::new(),
    };
    out.write_all(MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&now_ms.to_le_bytes())?;
    // Copy the counters shard by shard (short locks), then write without locks.
    let mut tables = Vec::new();
    store.for_each_table(|policy, plan, table| {
        let mut entries = Vec::new();
        table.for_each_caller(|key, runs| {
            if !runs.is_empty() {
                entries.push((key, runs.clone()));
            }
        });
        tables.push((policy.to_string(), plan.to_string(), entries));
    });
    put_u32(&mut out, tables.len() as u32)?;
    for (policy, plan, entries) in &tables {
        put_str(&mut out, policy)?;
        put_str(&mut out, plan)?;
        put_u64(&mut out, entries.len() as u64)?;
        for (key, runs) in entries {
            put_u64(&mut out, *key)?;
            put_runs(&mut out, runs)?;
        }
    }
    let mut totals = Vec::new();
    store.for_each_total(|policy, runs| totals.push((policy.to_string(), runs.clone())));
    put_u32(&mut out, totals.len() as u32)?;
    for (policy, runs) in &totals {
        put_str(&mut out, policy)?;
        put_runs(&mut out, runs)?;
    }
    let bans = store.bans.list(now_ms);
    put_u32(&mut out, bans.len() as u32)?;
    for (key, ban) in &bans {
        put_u64(&mut out, *key)?;
        put_u64(&mut out, ban.until_ms)?;
        put_u32(&mut out, ban.refusals)?;
        put_u32(&mut out, ban.level)?;
        match &ban.reason {
            Reason::Automatic => out.write_all(&[0])?,
            Reason::Manual(text) => {
                out.write_all(&[1])?;
                put_str(&mut out, text)?;
            }
        }
        put_str(&mut out, &ban.caller)?;
    }
    let digest = out.hash.clone().finalize();
    out.inner.write_all(&digest)?;
    let file = out.inner.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A state file older than this cannot hold a count that still matters (the longest
/// window is a day) and its 32-bit buckets could be mistaken for recent ones.
const MAX_AGE_MS: u64 = 20 * 86_400_000;

/// Reads `path` back into `store` at `now_ms`. `Ok(None)` when there is no file yet.
pub(super) fn restore(
    store: &MemoryStore,
    path: &Path,
    now_ms: u64,
) -> Result<Option<Restored>, StateError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let invalid = |reason| StateError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() < MAGIC.len() + 4 + 8 + 32 || &bytes[..MAGIC.len()] != MAGIC {
        return Err(invalid("no sluice header"));
    }
    let (body, digest) = bytes.split_at(bytes.len() - 32);
    if Sha256::digest(body).as_slice() != digest {
        return Err(invalid("checksum mismatch"));
    }
    let mut input = Reader {
        bytes: &body[MAGIC.len()..],
    };
    let version = input
        .u32()
        .filter(|v| [VERSION, VERSION_NO_BANS, VERSION_PAIRS].contains(v))
        .ok_or_else(|| invalid("unknown version"))?;
    let saved_at_ms = input.u64().ok_or_else(|| invalid("truncated"))?;
    if now_ms.saturating_sub(saved_at_ms) > MAX_AGE_MS {
        return Err(invalid("saved more than 20 days ago"));
    }
    // Parse everything first, so a malformed file restores nothing.
    let mut callers = Vec::new();
    let tables = input.u32().ok_or_else(|| invalid("truncated"))?;
    for _ in 0..tables {
        let policy = input.string().ok_or_else(|| invalid("bad table name"))?;
        let plan = input.string().ok_or_else(|| invalid("bad table name"))?;
        let count = input.u64().ok_or_else(|| invalid("truncated"))?;
        for _ in 0..count {
            let key = input.u64().ok_or_else(|| invalid("truncated"))?;
            let runs = input
                .runs(version)
                .ok_or_else(|| invalid("malformed counters"))?;
            callers.push((policy.clone(), plan.clone(), key, runs));
        }
    }
    let mut totals = Vec::new();
    let count = input.u32().ok_or_else(|| invalid("truncated"))?;
    for _ in 0..count {
        let policy = input.string().ok_or_else(|| invalid("bad policy name"))?;
        totals.push((
            policy,
            input
                .runs(version)
                .ok_or_else(|| invalid("malformed counters"))?,
        ));
    }
    let mut bans = Vec::new();
    if version == VERSION {
        let count = input.u32().ok_or_else(|| invalid("truncated"))?;
        for _ in 0..count {
            bans.push(input.ban().ok_or_else(|| invalid("malformed ban"))?);
        }
    }
    if !input.bytes.is_empty() {
        return Err(invalid("trailing bytes"));
    }
    let mut restored = Restored {
        saved_at_ms,
        totals: totals.len(),
        ..Restored::default()
    };
    for (key, ban) in bans {
        if ban.until_ms > now_ms && store.bans.set(key, ban, now_ms) {
            restored.bans += 1;
        }
    }
    for (policy, plan, key, runs) in callers {
        if store.restore(&policy, &plan, key, runs) {
            restored.callers += 1;
        } else {
            restored.dropped += 1;
        }
    }
    for (policy, runs) in totals {
        store.restore_total(&policy, runs);
    }
    Ok(Some(restored))
}

struct HashingWriter<W: Write> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn put_u32(out: &mut impl Write, value: u32) -> io::Result<()> {
    out.write_all(&value.to_le_bytes())
}

fn put_u64(out: &mut impl Write, value: u64) -> io::Result<()> {
    out.write_all(&value.to_le_bytes())
}

fn put_str(out: &mut impl Write, text: &str) -> io::Result<()> {
    put_u32(out, text.len() as u32)?;
    out.write_all(text.as_bytes())
}

fn put_runs(out: &mut impl Write, runs: &Runs) -> io::Result<()> {
    let words = runs.words();
    put_u32(out, words.len() as u32)?;
    for word in words {
        put_u32(out, *word)?;
    }
    Ok(())
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let (head, rest) = self.bytes.split_at_checked(n)?;
        self.bytes = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn string(&mut self) -> Option<String> {
        let len = self.u32()? as usize;
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn ban(&mut self) -> Option<(u64, Ban)> {
        let key = self.u64()?;
        let until_ms = self.u64()?;
        let refusals = self.u32()?;
        let level = self.u32()?;
        let reason = match self.u8()? {
            0 => Reason::Automatic,
            1 => Reason::Manual(self.string()?),
            _ => return None,
        };
        let caller = self.string()?;
        let ban = Ban {
            caller,
            reason,
            until_ms,
            refusals,
            level,
        };
        Some((key, ban))
    }

    fn runs(&mut self, version: u32) -> Option<Runs> {
        let len = self.u32()? as usize;
        if len > MAX_WORDS {
            return None;
        }
        let words: Vec<u32> = (0..len).map(|_| self.u32()).collect::<Option<_>>()?;
        if version == VERSION_PAIRS {
            Runs::from_v1_words(&words)
        } else {
            Runs::from_words(&words)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::limit::{Now, Window, quota};
    use crate::store::bans::{Ban, Reason};
    use crate::store::memory::tests::{decide, memory_store};
    use crate::store::{Handle, Scope, Store, Verdict};

    fn store_with_traffic() -> (Arc<MemoryStore>, Store, Scope) {
        let (memory, store) = memory_store(100);
        let quotas = vec![quota(Window::Minute, 3)];
        let total = [quota(Window::Hour, 100)];
        let scope = store.scope("standard", "anonymous", quotas, &total);
        (memory, store, scope)
    }

    #[test]
    fn counters_survive_a_save_and_restore() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.state");
        let (memory, _store, counters) = store_with_traffic();
        for _ in 0..3 {
            assert_eq!(decide(&memory, &counters, 7, 1_000), Verdict::Admitted);
        }
        save(&memory, &path, 1_000).unwrap();

        let (memory, fresh, counters) = store_with_traffic();
        let restored = restore(&memory, &path, 2_000).unwrap().unwrap();
        assert_eq!(
            (restored.callers, restored.totals, restored.saved_at_ms),
            (1, 1, 1_000)
        );
        assert_eq!(decide(&memory, &counters, 7, 2_000), Verdict::Limited);
        assert_eq!(decide(&memory, &counters, 8, 2_000), Verdict::Admitted);
        assert_eq!(fresh.tracked(), 2);
    }

    #[test]
    fn bans_survive_a_save_and_restore_and_end_when_they_would_have() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.state");
        let (memory, _store, _) = store_with_traffic();
        let manual = Ban {
            caller: "consumer:a|b".to_string(),
            reason: Reason::Manual("scraping".to_string()),
            until_ms: 61_000,
            refusals: 0,
            level: 0,
        };
        let automatic = Ban {
            caller: "ip:1.2.3.4".to_string(),
            reason: Reason::Automatic,
            until_ms: 601_000,
            refusals: 50,
            level: 1,
        };
        memory.bans.set(1, manual.clone(), 1_000);
        memory.bans.set(2, automatic.clone(), 1_000);
        save(&memory, &path, 1_000).unwrap();

        let (memory, fresh, _) = store_with_traffic();
        let restored = restore(&memory, &path, 2_000).unwrap().unwrap();
        assert_eq!(restored.bans, 2);
        let bans = memory.bans.list(2_000);
        assert_eq!(bans, [(1, manual), (2, automatic)]);
        assert_eq!(fresh.banned(1, 60_999), Some(61_000));
        assert_eq!(fresh.banned(1, 61_000), None);
        // A restart after a ban ended does not bring it back.
        let (later, _, _) = store_with_traffic();
        let restored = restore(&later, &path, 100_000).unwrap().unwrap();
        assert_eq!(restored.bans, 1);
    }

    #[test]
    fn a_caller_with_every_window_busy_survives_a_save_and_restore() {
        let quotas = vec![
            quota(Window::Second, 1_000),
            quota(Window::Minute, 1_000),
            quota(Window::Hour, 1_000),
        ];
        let (memory, store) = memory_store(10);
        let counters = store.scope("busy", "anonymous", quotas.clone(), &[]);
        // One request per hour bucket, then per minute bucket, then per second bucket:
        // each window ends up with about 125 live runs.
        let start = 1_000_000_000;
        let hour = (0..125).map(|i| start + i * 28_800);
        let end_of_hour = start + 125 * 28_800;
        let minute = (0..125).map(|i| end_of_hour + i * 480);
        let end_of_minute = end_of_hour + 125 * 480;
        let second = (0..125).map(|i| end_of_minute + i * 8);
        let mut last = 0;
        for ms in hour.chain(minute).chain(second) {
            assert_eq!(decide(&memory, &counters, 7, ms), Verdict::Admitted);
            last = ms;
        }
        let used = |scope: &Scope| {
            let Handle::Memory(bound) = &scope.handle else {
                panic!("a scope of another engine");
            };
            let mut runs = bound.table.snapshot(7, &Now::sliding(last)).unwrap();
            assert!(runs.words().len() > 700, "{} words", runs.words().len());
            quotas
                .iter()
                .map(|q| runs.used_at(q, &Now::sliding(last)))
                .collect::<Vec<_>>()
        };
        let before = used(&counters);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.state");
        save(&memory, &path, last).unwrap();

        let (memory, fresh) = memory_store(10);
        let counters = fresh.scope("busy", "anonymous", quotas.clone(), &[]);
        let restored = restore(&memory, &path, last).unwrap().unwrap();
        assert_eq!(restored.callers, 1);
        assert_eq!(used(&counters), before);
    }

    #[test]
    fn a_first_layout_file_is_read_and_its_exact_pairs_converted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.state");
        // Version 1: plan "standard/anonymous" (3 a minute, exact), caller 7 with
        // (1 000 ms, 3 requests) as one pair; no totals.
        let minute = Window::Minute as usize;
        let header: u64 = (1 << (8 * minute)) | (1 << (8 * 5 + minute));
        let mut body = Vec::new();
        body.extend_from_slice(MAGIC);
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&1_000u64.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        for name in ["standard", "anonymous"] {
            body.extend_from_slice(&(name.len() as u32).to_le_bytes());
            body.extend_from_slice(name.as_bytes());
        }
        body.extend_from_slice(&1u64.to_le_bytes());
        body.extend_from_slice(&7u64.to_le_bytes());
        body.extend_from_slice(&4u32.to_le_bytes());
        for word in [header as u32, (header >> 32) as u32, 1_000, 3] {
            body.extend_from_slice(&word.to_le_bytes());
        }
        body.extend_from_slice(&0u32.to_le_bytes());
        let digest = Sha256::digest(&body);
        body.extend_from_slice(&digest);
        std::fs::write(&path, &body).unwrap();

        let (memory, _store, counters) = store_with_traffic();
        let restored = restore(&memory, &path, 2_000).unwrap().unwrap();
        assert_eq!(restored.callers, 1);
        assert_eq!(decide(&memory, &counters, 7, 2_000), Verdict::Limited);
        assert_eq!(decide(&memory, &counters, 7, 60_999), Verdict::Limited);
        assert_eq!(decide(&memory, &counters, 7, 61_000), Verdict::Admitted);
    }

    #[test]
    fn missing_corrupt_and_foreign_files_are_reported_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.state");
        let (memory, _store, counters) = store_with_traffic();
        let memory = &*memory;
        assert!(restore(memory, &path, 1_000).unwrap().is_none());

        std::fs::write(&path, b"{\"not\": \"ours\"}").unwrap();
        assert!(matches!(
            restore(memory, &path, 1_000),
            Err(StateError::Invalid { .. })
        ));

        decide(memory, &counters, 7, 1_000);
        save(memory, &path, 1_000).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let err = restore(memory, &path, 1_000).unwrap_err();
        assert!(err.to_string().contains("checksum mismatch"), "{err}");

        save(memory, &path, 1_000).unwrap();
        let stale = restore(memory, &path, 1_000 + 21 * 86_400_000).unwrap_err();
        assert!(stale.to_string().contains("20 days"), "{stale}");
    }
}
