//! One uid per workspace under a root host: the uid a workspace's kernels
//! run as is the owner of its `ws` dir, so the allocation is recorded on
//! disk, survives restarts, and is the same for every kernel of the owner
//! (kernels of one owner share its workspace).
//!
//! A workspace without a dir yet gets a free uid from the configured range
//! (not the owner of another workspace under the root, pooled ones
//! included, and not a host account), starting at a hash of the owner so
//! most owners get the same uid again should their files be removed. The
//! dir is created owned by it (0700) under one process-wide lock, so two
//! spawns never take the same uid. A pooled kernel's workspace gets its
//! uid the same way; handed to an owner, the dir is renamed and keeps its
//! owner: the owner's uid is the pooled kernel's.
//!
//! The uids in use are scanned from disk once per root and host process,
//! then kept in memory (a new session's start would otherwise stat every
//! workspace under the root: ~5-10 ms with 1,000 sessions): a uid
//! allocated here is added, one freed (its workspace removed) stays taken
//! until the range seems full, when the root is scanned again.
//!
//! An existing workspace owned by the configured single uid (65534 from
//! before uid ranges) keeps that uid: its files stay accessible. One owned
//! by root (made before any kernel ran) or by any other uid is handed a
//! fresh uid (the dir itself, not its files): a kernel never runs as a
//! host account because someone chowned a dir.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::sandbox::SandboxError;

/// Serialises allocation (scan, pick, create) within this host process,
/// and holds the uids in use under each root (scanned on first use).
static USED: Mutex<Option<HashMap<PathBuf, BTreeSet<u32>>>> = Mutex::new(None);

/// The uid of the workspace `ws` under `root`, allocating one from
/// `lo..=hi` (and creating `ws`, owned by it) when it has none.
/// `seed` (the owner) picks where the search starts; `single`: the uid of
/// kernels without a range, kept by workspaces that have it.
pub(crate) fn ensure(
    root: &Path,
    ws: &Path,
    (lo, hi): (u32, u32),
    single: u32,
    seed: &str,
) -> Result<u32, SandboxError> {
    let mut held = USED.lock().unwrap_or_else(|e| e.into_inner());
    let used = held
        .get_or_insert_with(HashMap::new)
        .entry(root.to_path_buf())
        .or_insert_with(|| used_uids(root));
    let err = |err| SandboxError::Workspace {
        path: ws.to_path_buf(),
        err,
    };
    match std::fs::symlink_metadata(ws) {
        Ok(meta) if !meta.is_dir() => Err(err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "it is not a directory (symlinks are not followed)",
        ))),
        Ok(meta) if (lo..=hi).contains(&meta.uid()) || meta.uid() == single => {
            used.insert(meta.uid());
            Ok(meta.uid())
        }
        Ok(_) => {
            let uid = free_uid(root, (lo, hi), seed, used)?;
            std::os::unix::fs::lchown(ws, Some(uid), Some(uid)).map_err(err)?;
            Ok(uid)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let uid = free_uid(root, (lo, hi), seed, used)?;
            if let Some(parent) = ws.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(parent)
                    .map_err(err)?;
            }
            // Not recursive: a dir someone made meanwhile is an error,
            // never silently someone else's.
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(ws)
                .map_err(err)?;
            std::os::unix::fs::lchown(ws, Some(uid), Some(uid)).map_err(err)?;
            Ok(uid)
        }
        Err(e) => Err(err(e)),
    }
}

/// A uid in `lo..=hi` that owns no workspace under `root` and is no host
/// account, now counted in `used`; `used` is scanned again from disk when
/// it seems full (uids freed since the last scan).
fn free_uid(
    root: &Path,
    (lo, hi): (u32, u32),
    seed: &str,
    used: &mut BTreeSet<u32>,
) -> Result<u32, SandboxError> {
    let span = u64::from(hi - lo) + 1;
    let start = fnv(seed) % span;
    let pick = |used: &BTreeSet<u32>| {
        (0..span)
            .map(|i| lo + ((start + i) % span) as u32)
            .find(|uid| !used.contains(uid) && !host_account(*uid))
    };
    let uid = match pick(used) {
        Some(uid) => uid,
        None => {
            *used = used_uids(root);
            pick(used).ok_or(SandboxError::UidRangeFull { lo, hi })?
        }
    };
    used.insert(uid);
    Ok(uid)
}

/// Owners of every workspace under `root`: `<root>/.pool-*` (or its
/// volume's `fs/ws`), `<root>/<home>/ws` (or `<home>/vol/fs/ws`) and, recursively, `<home>/children/<home>/ws`.
/// Never follows a symlink.
fn used_uids(root: &Path) -> BTreeSet<u32> {
    fn home(dir: &Path, out: &mut BTreeSet<u32>) {
        for ws in [
            dir.join("ws"),
            super::volume::workspace_in(&dir.join(super::volume::VOLUME)),
        ] {
            if let Ok(m) = std::fs::symlink_metadata(ws) {
                if m.is_dir() {
                    out.insert(m.uid());
                }
            }
        }
        for child in entries(&dir.join("children")) {
            home(&child, out);
        }
    }
    fn entries(dir: &Path) -> Vec<std::path::PathBuf> {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        rd.flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect()
    }
    let mut out = BTreeSet::new();
    for dir in entries(root) {
        let pooled = dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(".pool-"));
        if pooled {
            // A pooled workspace is the dir itself, or the one in its volume.
            for ws in [dir.clone(), super::volume::workspace_in(&dir)] {
                if let Ok(m) = std::fs::symlink_metadata(ws) {
                    out.insert(m.uid());
                }
            }
        } else {
            home(&dir, &mut out);
        }
    }
    out
}

fn host_account(uid: u32) -> bool {
    matches!(
        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)),
        Ok(Some(_))
    )
}

/// 64-bit FNV-1a (stable across builds, unlike std's hasher).
fn fnv(s: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_only() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn workspaces_get_distinct_uids_that_stay_theirs() {
        if !root_only() {
            return; // chown needs root; the sandbox tests cover it too
        }
        let root = tempfile::tempdir().unwrap();
        let range = (300_000, 300_002);
        let a = root.path().join("a/ws");
        let b = root.path().join("b/ws");
        let pool = root.path().join(".pool-1-2-x");
        let ua = ensure(root.path(), &a, range, 65534, "a").unwrap();
        let ub = ensure(root.path(), &b, range, 65534, "b").unwrap();
        let up = ensure(root.path(), &pool, range, 65534, "p").unwrap();
        let all: BTreeSet<u32> = [ua, ub, up].into();
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(all.iter().all(|u| (300_000..=300_002).contains(u)));
        assert_eq!(
            ensure(root.path(), &a, range, 65534, "a").unwrap(),
            ua,
            "recorded"
        );
        assert_eq!(std::fs::metadata(&a).unwrap().uid(), ua);
        let full = ensure(root.path(), &root.path().join("c/ws"), range, 65534, "c");
        assert!(matches!(full, Err(SandboxError::UidRangeFull { .. })));
        // A removed workspace frees its uid.
        std::fs::remove_dir(&b).unwrap();
        let uc = ensure(root.path(), &root.path().join("c/ws"), range, 65534, "c").unwrap();
        assert_eq!(uc, ub);
    }

    #[test]
    fn a_symlink_is_never_taken_for_a_workspace() {
        let root = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("a")).unwrap();
        let ws = root.path().join("a/ws");
        std::os::unix::fs::symlink(target.path(), &ws).unwrap();
        assert!(ensure(root.path(), &ws, (300_000, 300_010), 65534, "a").is_err());
    }
}
