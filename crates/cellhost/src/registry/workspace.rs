//! Per-session workspaces of sandboxed kernels, under
//! `<data_dir>/workspaces`, mounted at `/workspace` in the sandbox.
//!
//! Layout: a session's home is `<root>/<name(session)>`, its workspace
//! `<home>/ws`; a delegated child's home is `<parent home>/children/
//! <name(child)>`. A kernel mounts only its own `ws`, so a parent never sees
//! its children's files (nor they its), and disposing a session removes its
//! home with every child's in it.
//!
//! A workspace outlives its kernel: eviction and idle reaping lose the
//! interpreter's state, not the files. Pooled kernels start on a workspace
//! of their own (`<root>/.pool-…`); handed to an owner without a workspace
//! yet, it is renamed to the owner's. The sandbox's bind mount follows the
//! directory, not its name, so the kernel keeps using it.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::key::CHILD_SEPARATOR;
use super::volume;

/// Prefix of pooled kernels' workspaces.
const POOL_PREFIX: &str = ".pool-";

/// A stable, filesystem-safe, collision-resistant name for one owner
/// part: a readable prefix plus a 64-bit FNV-1a hash of the whole part
/// (stable across builds and restarts, unlike std's hasher).
pub(crate) fn dir_name(part: &str) -> String {
    let readable: String = part
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(48)
        .collect();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in part.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{readable}-{hash:016x}")
}

/// The owner's home: its workspace and its children's homes.
pub(crate) fn home(root: &Path, owner: &str) -> PathBuf {
    let mut path = root.to_path_buf();
    for (i, part) in owner.split(CHILD_SEPARATOR).enumerate() {
        if i > 0 {
            path.push("children");
        }
        path.push(dir_name(part));
    }
    path
}

/// `owner`'s package dir (what `%pip` installs; see [`crate::packages`]):
/// beside its workspace (in its volume when it has one).
pub(crate) fn packages_of_owner(root: &Path, owner: &str, volumes: bool) -> PathBuf {
    crate::packages::dir_for_workspace(&of_owner(root, owner, volumes))
}

/// Remove a pooled kernel's workspace and the package dir beside it (its
/// whole volume when it has one).
pub(crate) fn remove_pooled(root: &Path, dir: &Path) {
    if let Some(vol) = volume::of_workspace(dir) {
        // Detached first: removing the image leaves its filesystem mounted
        // (and the loop device attached) for as long as this process lives.
        crate::sys::mount::unmount_under(vol);
        remove(root, vol);
        return;
    }
    remove(root, dir);
    remove(root, &crate::packages::dir_for_workspace(dir));
}

/// The directory mounted at `/workspace` for `owner`'s kernels:
/// `<home>/ws`, or with `volumes` `<home>/vol/fs/ws` (in the volume; a
/// `<home>/ws` made before volumes were on is kept, unbounded).
pub(crate) fn of_owner(root: &Path, owner: &str, volumes: bool) -> PathBuf {
    let home = home(root, owner);
    if volumes {
        let vol = home.join(volume::VOLUME);
        let legacy = home.join("ws");
        let legacy_only = std::fs::symlink_metadata(&vol).is_err()
            && std::fs::symlink_metadata(&legacy).is_ok_and(|m| m.is_dir());
        if !legacy_only {
            return volume::workspace_in(&vol);
        }
    }
    home.join("ws")
}

/// A pooled kernel's workspace: `<root>/.pool-<host pid>-<host start
/// time>-<random>` (the host is in the name so a sweep never takes a live
/// host's pool), or with `volumes` the workspace in a volume dir so named.
pub(crate) fn pool_dir(root: &Path, volumes: bool) -> PathBuf {
    let pid = std::process::id();
    let start = crate::kernel::process_start_time(pid).unwrap_or(0);
    let dir = root.join(format!(
        "{POOL_PREFIX}{pid}-{start}-{}",
        crate::kernel::random_hex(6)
    ));
    if volumes {
        volume::workspace_in(&dir)
    } else {
        dir
    }
}

/// `true` when `path` (under `root`) lies in a live other host's pool.
pub(crate) fn in_live_pool(root: &Path, path: &Path) -> bool {
    path.strip_prefix(root)
        .ok()
        .and_then(|rest| rest.components().next())
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .is_some_and(|name| name.starts_with(POOL_PREFIX) && pool_host_alive(&name))
}

/// `true` when a pool dir's name names a host that still runs.
fn pool_host_alive(name: &str) -> bool {
    let mut parts = name.trim_start_matches(POOL_PREFIX).split('-');
    let (Some(pid), Some(start)) = (parts.next(), parts.next()) else {
        return false;
    };
    match (pid.parse(), start.parse()) {
        (Ok(pid), Ok(start_time)) => {
            crate::kernel::record::ProcessId { pid, start_time }.is_same_live_process()
        }
        _ => false,
    }
}

/// Remove `dir` if it lies under `root` through real directories only
/// (never through or at a symlink). Returns whether it was removed.
pub(crate) fn remove(root: &Path, dir: &Path) -> bool {
    let Ok(rest) = dir.strip_prefix(root) else {
        return false;
    };
    if rest.as_os_str().is_empty() {
        return false;
    }
    let mut path = root.to_path_buf();
    for part in rest.components() {
        if !matches!(part, std::path::Component::Normal(_)) {
            return false;
        }
        path.push(part);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => {}
            _ => return false,
        }
    }
    // Volumes in it (its own, its children's) are detached first: their
    // kernels are gone, and the loop devices go with the mounts.
    crate::sys::mount::unmount_under(dir);
    std::fs::remove_dir_all(dir).is_ok()
}

/// Hand a pooled kernel's workspace (and the package dir beside it) to
/// `owner`: rename them to the owner's, unless the owner already has
/// either (then `false`: the pooled kernel cannot serve this owner, whose
/// files live elsewhere).
pub(crate) fn adopt(root: &Path, pooled: &Path, owner: &str) -> bool {
    if let Some(vol) = volume::of_workspace(pooled) {
        // One rename of the volume dir: the mount inside follows it.
        let home = home(root, owner);
        let target = home.join(volume::VOLUME);
        if std::fs::symlink_metadata(&target).is_ok()
            || std::fs::symlink_metadata(home.join("ws")).is_ok()
        {
            return false;
        }
        let made = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&home);
        return made.is_ok() && rename_noreplace(vol, &target);
    }
    let target = of_owner(root, owner, false);
    let pkgs = packages_of_owner(root, owner, false);
    if std::fs::symlink_metadata(&target).is_ok() || std::fs::symlink_metadata(&pkgs).is_ok() {
        return false;
    }
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(home(root, owner));
    if !(made.is_ok() && rename_noreplace(pooled, &target)) {
        return false;
    }
    let pooled_pkgs = crate::packages::dir_for_workspace(pooled);
    if std::fs::symlink_metadata(&pooled_pkgs).is_ok() && !rename_noreplace(&pooled_pkgs, &pkgs) {
        // The running kernel keeps its (empty) dir mounted; `%pip` and
        // later restarts use the owner's.
        remove(root, &pooled_pkgs);
    }
    true
}

/// `rename(2)` that fails instead of replacing an existing (empty) target:
/// two kernels of one owner adopting at once must not share one name.
fn rename_noreplace(from: &Path, to: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (Ok(from), Ok(to)) = (
        std::ffi::CString::new(from.as_os_str().as_bytes()),
        std::ffi::CString::new(to.as_os_str().as_bytes()),
    ) else {
        return false;
    };
    // SAFETY: two valid NUL-terminated paths; the call only renames.
    unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        ) == 0
    }
}

/// Remove pooled workspaces a host that is gone left (their kernels died
/// with it); a live host's pool is left alone.
pub(crate) fn sweep_pool_dirs(root: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(POOL_PREFIX) && !pool_host_alive(&name)
        })
        .filter(|e| remove(root, &e.path()))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_safe_and_distinct() {
        let name = dir_name("conv-1");
        assert_eq!(name, dir_name("conv-1"));
        assert!(
            name.starts_with("conv-1-") && name.len() == "conv-1-".len() + 16,
            "{name}"
        );
        assert_ne!(
            dir_name("a/b"),
            dir_name("a_b"),
            "the hash tells sanitised twins apart"
        );
        for owner in ["../../etc", "a/b", ".pool-x", "ü", ""] {
            let name = dir_name(owner);
            assert!(!name.contains('/') && !name.starts_with('.'), "{name}");
        }
        assert!(dir_name(&"x".repeat(512)).len() < 70);
    }

    #[test]
    fn children_live_in_their_parents_home_but_outside_its_workspace() {
        let root = Path::new("/r");
        let parent = of_owner(root, "p", false);
        let child = of_owner(root, "p::child::c", false);
        let grandchild = of_owner(root, "p::child::c::child::g", false);
        assert!(child.starts_with(home(root, "p")));
        assert!(
            !child.starts_with(&parent),
            "the parent's mount never shows a child's files"
        );
        assert!(grandchild.starts_with(home(root, "p::child::c")));
        assert!(!grandchild.starts_with(&child));
        assert_ne!(home(root, "p"), home(root, "q"));
    }

    #[test]
    fn a_pooled_workspace_is_adopted_only_by_an_owner_without_one() {
        let root = tempfile::tempdir().unwrap();
        let pooled = pool_dir(root.path(), false);
        std::fs::create_dir(&pooled).unwrap();
        std::fs::write(pooled.join("f"), "x").unwrap();
        assert!(adopt(root.path(), &pooled, "a::child::b"));
        assert!(of_owner(root.path(), "a::child::b", false)
            .join("f")
            .exists());
        let second = pool_dir(root.path(), false);
        std::fs::create_dir(&second).unwrap();
        assert!(
            !adopt(root.path(), &second, "a::child::b"),
            "it already has its files"
        );
        assert_eq!(
            sweep_pool_dirs(root.path()),
            0,
            "this host is alive: its pool stays"
        );
        let dead = root.path().join(".pool-1-1-abc");
        std::fs::create_dir(&dead).unwrap();
        assert_eq!(sweep_pool_dirs(root.path()), 1, "a dead host's pool goes");
        assert!(!dead.exists() && second.exists());
        assert!(remove(root.path(), &home(root.path(), "a")));
        assert!(!of_owner(root.path(), "a::child::b", false).exists());
    }

    #[test]
    fn removal_never_follows_symlinks_or_leaves_the_root() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(outside.path().join("ws")).unwrap();
        let link = root.path().join("link");
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        assert!(!remove(root.path(), &link));
        assert!(
            !remove(root.path(), &link.join("ws")),
            "not through a link either"
        );
        assert!(!remove(root.path(), outside.path()));
        assert!(!remove(root.path(), &root.path().join("../x")));
        assert!(!remove(root.path(), root.path()));
        assert!(outside.path().join("ws").exists());
    }
}
