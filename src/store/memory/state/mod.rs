//! The memory store's state file: counters that survive a restart or a crash.
//!
//! Every few seconds, and once more at shutdown, the counters are written to
//! `state_file.tmp`, fsynced and renamed over `state_file`, so the file on disk is
//! always a whole snapshot. At start the file is read back; a missing file means a
//! first start, and a corrupt or foreign one (bad magic, version or checksum,
//! malformed counters) is reported and set aside as `state_file.corrupt-<ms>`, never a
//! crash and never overwritten by the next save. A `kill -9` loses what
//! was counted since the last snapshot: at most [`SAVE_EVERY`] of traffic.
//!
//! Format, little-endian: `SLUICEST`, version `u32`, saved-at ms `u64`, then tables
//! (policy, plan, callers: key `u64` + run words), totals (policy, run words) and bans
//! (key `u64`, until ms `u64`, refusals `u32`, level `u32`, kind `u8` (0 automatic, 1
//! manual), reason, caller), then the SHA-256 of everything before it. Buckets are
//! wall-clock based, so counts restored after a restart expire exactly when they would
//! have, and so do bans. Version 4 adds, after the bans, the parts of keyed buckets
//! (tables: policy, plan, then key `u64` + parts), and is written only when some
//! are known, so a store without keyed buckets still writes version 3, which older
//! releases read. Version 3 files (no parts: their buckets are exported by digest),
//! version 2 files (no bans) and version 1 files (exact logs stored as `(ms, count)`
//! pairs) are still read, and converted.

use std::fs::{File, OpenOptions};
use std::hash::BuildHasher;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::names::Refresh;
use super::{MemoryStore, Table, shard_of};
use crate::limit::{MAX_WORDS, Runs};
use crate::store::CallerKey;
use crate::store::bans::{Ban, Reason};

/// How often the counters are written while serving.
pub const SAVE_EVERY: Duration = Duration::from_secs(5);

const MAGIC: &[u8; 8] = b"SLUICEST";
const VERSION: u32 = 4;
/// Tables, totals and bans, no keyed buckets' parts.
const VERSION_NO_PARTS: u32 = 3;
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
    let parts = parts_of(store);
    let version = if parts.is_empty() {
        VERSION_NO_PARTS
    } else {
        VERSION
    };
    out.write_all(MAGIC)?;
    out.write_all(&version.to_le_bytes())?;
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
    if !parts.is_empty() {
        put_parts(&mut out, &parts)?;
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

/// Each table's keyed buckets' parts, for the tables that know any.
type TableParts = Vec<(String, String, Vec<(CallerKey, Box<str>)>)>;

fn parts_of(store: &MemoryStore) -> TableParts {
    let mut parts = Vec::new();
    store.for_each_table(|policy, plan, table| {
        let known = table.known_names().map(|names| names.entries());
        if let Some(entries) = known.filter(|entries| !entries.is_empty()) {
            parts.push((policy.to_string(), plan.to_string(), entries));
        }
    });
    parts
}

fn put_parts(out: &mut impl Write, parts: &TableParts) -> io::Result<()> {
    put_u32(out, parts.len() as u32)?;
    for (policy, plan, entries) in parts {
        put_str(out, policy)?;
        put_str(out, plan)?;
        put_u64(out, entries.len() as u64)?;
        for (key, text) in entries {
            put_u64(out, *key)?;
            put_str(out, text)?;
        }
    }
    Ok(())
}

/// Moves the unreadable state file at `path` to `<path>.corrupt-<now_ms>`, where the
/// next save cannot overwrite it; returns the new name.
pub(super) fn set_aside(path: &Path, now_ms: u64) -> io::Result<PathBuf> {
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".corrupt-{now_ms}"));
    let aside = PathBuf::from(aside);
    std::fs::rename(path, &aside)?;
    Ok(aside)
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
    let parsed = parse(&bytes, now_ms).map_err(|reason| StateError::Invalid {
        path: path.to_path_buf(),
        reason,
    })?;
    Ok(Some(apply(store, parsed, now_ms)))
}

/// What a state file holds, read whole before any of it is restored: a malformed
/// file restores nothing.
struct Parsed {
    saved_at_ms: u64,
    /// (policy, plan, caller, counters)
    callers: Vec<(String, String, u64, Runs)>,
    /// (policy, its total's counters)
    totals: Vec<(String, Runs)>,
    bans: Vec<(u64, Ban)>,
    /// (policy, plan, keyed bucket, its parts)
    parts: Vec<(String, String, u64, String)>,
}

/// Reads a state file's `bytes`, or says why it cannot be restored.
fn parse(bytes: &[u8], now_ms: u64) -> Result<Parsed, &'static str> {
    if bytes.len() < MAGIC.len() + 4 + 8 + 32 || &bytes[..MAGIC.len()] != MAGIC {
        return Err("no sluice header");
    }
    let (body, digest) = bytes.split_at(bytes.len() - 32);
    if Sha256::digest(body).as_slice() != digest {
        return Err("checksum mismatch");
    }
    let mut input = Reader {
        bytes: &body[MAGIC.len()..],
    };
    let version = input
        .u32()
        .filter(|v| [VERSION, VERSION_NO_PARTS, VERSION_NO_BANS, VERSION_PAIRS].contains(v))
        .ok_or("unknown version")?;
    let saved_at_ms = input.u64().ok_or("truncated")?;
    if now_ms.saturating_sub(saved_at_ms) > MAX_AGE_MS {
        return Err("saved more than 20 days ago");
    }
    let mut callers = Vec::new();
    let tables = input.u32().ok_or("truncated")?;
    for _ in 0..tables {
        let policy = input.string().ok_or("bad table name")?;
        let plan = input.string().ok_or("bad table name")?;
        let count = input.u64().ok_or("truncated")?;
        for _ in 0..count {
            let key = input.u64().ok_or("truncated")?;
            let runs = input.runs(version).ok_or("malformed counters")?;
            callers.push((policy.clone(), plan.clone(), key, runs));
        }
    }
    let mut totals = Vec::new();
    let count = input.u32().ok_or("truncated")?;
    for _ in 0..count {
        let policy = input.string().ok_or("bad policy name")?;
        totals.push((policy, input.runs(version).ok_or("malformed counters")?));
    }
    let mut bans = Vec::new();
    if version >= VERSION_NO_PARTS {
        let count = input.u32().ok_or("truncated")?;
        for _ in 0..count {
            bans.push(input.ban().ok_or("malformed ban")?);
        }
    }
    let parts = match version {
        VERSION => input.parts().ok_or("malformed key parts")?,
        _ => Vec::new(),
    };
    if !input.bytes.is_empty() {
        return Err("trailing bytes");
    }
    Ok(Parsed {
        saved_at_ms,
        callers,
        totals,
        bans,
        parts,
    })
}

/// Puts what a state file held back into `store`: bans still in force, callers
/// (those that fit), totals.
fn apply(store: &MemoryStore, parsed: Parsed, now_ms: u64) -> Restored {
    let mut restored = Restored {
        saved_at_ms: parsed.saved_at_ms,
        totals: parsed.totals.len(),
        ..Restored::default()
    };
    for (key, ban) in parsed.bans {
        if ban.until_ms > now_ms && store.bans.set(key, ban, now_ms) {
            restored.bans += 1;
        }
    }
    for (policy, plan, key, runs) in parsed.callers {
        if store.restore(&policy, &plan, key, runs) {
            restored.callers += 1;
        } else {
            restored.dropped += 1;
        }
    }
    for (policy, runs) in parsed.totals {
        store.restore_total(&policy, runs);
    }
    for (policy, plan, key, text) in parsed.parts {
        let table = store.table(&policy, &plan);
        table.names(Refresh::Never).restore(key, &text, now_ms);
    }
    restored
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

    /// The keyed buckets' parts of a version 4 file.
    fn parts(&mut self) -> Option<Vec<(String, String, u64, String)>> {
        let mut parts = Vec::new();
        for _ in 0..self.u32()? {
            let (policy, plan) = (self.string()?, self.string()?);
            for _ in 0..self.u64()? {
                let key = self.u64()?;
                parts.push((policy.clone(), plan.clone(), key, self.string()?));
            }
        }
        Some(parts)
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

/// The state file as the memory store keeps it: written, read back, walked.
impl MemoryStore {
    /// The state file, if the store keeps one.
    pub fn state_file(&self) -> Option<&Path> {
        self.state_file.as_deref()
    }

    /// Reads the state file back, if there is one; a corrupt or foreign file is
    /// logged and set aside (`state_file.corrupt-<ms>`), never overwritten unread.
    pub fn restore_state(&self, now_ms: u64) {
        let Some(path) = &self.state_file else {
            return;
        };
        match restore(self, path, now_ms) {
            Ok(Some(restored)) => tracing::info!(
                file = %path.display(),
                callers = restored.callers,
                totals = restored.totals,
                dropped = restored.dropped,
                bans = restored.bans,
                saved_at_ms = restored.saved_at_ms,
                "counters restored from the state file"
            ),
            Ok(None) => {
                tracing::info!(file = %path.display(), "no state file yet; counters start empty")
            }
            Err(err @ StateError::Invalid { .. }) => {
                // Kept for a look, and out of the way of the next save.
                match set_aside(path, now_ms) {
                    Ok(aside) => tracing::error!(
                        set_aside = %aside.display(),
                        "{err}; the file is set aside and counters start empty"
                    ),
                    Err(io) => tracing::error!(
                        error = %io,
                        "{err}; it cannot be set aside, and counters start empty"
                    ),
                }
            }
            Err(err) => tracing::error!("{err}; counters start empty"),
        }
    }

    /// Writes the state file now, if there is one; a failure is logged.
    pub fn save_state(&self, now_ms: u64) {
        let Some(path) = &self.state_file else {
            return;
        };
        if let Err(err) = save(self, path, now_ms) {
            tracing::error!(file = %path.display(), error = %err, "cannot write the state file");
        }
    }

    /// Calls `f` with every table's (policy, plan) and the table.
    fn for_each_table(&self, mut f: impl FnMut(&str, &str, &Table)) {
        let tables: Vec<_> = self
            .tables
            .lock()
            .iter()
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect();
        for ((policy, plan), table) in tables {
            f(&policy, &plan, &table);
        }
    }

    /// Calls `f` with every policy's total counter.
    fn for_each_total(&self, mut f: impl FnMut(&str, &Runs)) {
        let totals: Vec<_> = self
            .totals
            .lock()
            .iter()
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect();
        for (policy, total) in totals {
            f(&policy, &total.lock());
        }
    }

    /// Puts back a caller's counters read from a state file; false if full.
    fn restore(&self, policy: &str, plan: &str, caller: CallerKey, runs: Runs) -> bool {
        let table = self.table(policy, plan);
        let hash = table.hasher.hash_one(caller);
        let mut shard = table.shards[shard_of(hash)].lock();
        if let Some(known) = shard.find_mut(hash, caller) {
            *known = runs;
            return true;
        }
        let consumer = self.is_consumer(caller);
        if !consumer && !table.try_take_slot() {
            return false;
        }
        table.insert(&mut shard, hash, caller, runs, consumer);
        true
    }

    /// Puts back a policy's total counter read from a state file.
    fn restore_total(&self, policy: &str, runs: Runs) {
        *self.total(policy).lock() = runs;
    }
}

#[cfg(test)]
mod tests;
