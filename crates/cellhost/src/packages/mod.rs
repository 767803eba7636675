//! `%pip install` carried out by the host, outside the kernel.
//!
//! A kernel never needs the network or a writable site-packages to get a
//! package: its `pipmagic` module (`runner/pipmagic.py`) sends the `%pip`
//! line over the kernel's tool socket as the reserved request
//! `cellhost:pip` (not a user tool: no budget, no allow-list; refused when no
//! cell runs). The host checks the line against `[packages]`
//! (`line.rs`), then runs pip in a bubblewrap sandbox of its own
//! (`sandbox.rs`: network on, unprivileged uid, read-only system, writable
//! only the session's package dir and a shared download cache) with
//! `--target` into the session's package dir, streaming pip's output back
//! as `{"output": …}` frames and ending with `{"result": {"status", "path"}}`
//! or `{"error": …}` (pip's own last lines, or the rule that refused).
//!
//! The package dir sits next to the session's workspace (`<home>/pkgs`
//! under the manager; `<workspace>.pkgs` for a workspace of another name,
//! such as a pooled kernel's, which is renamed with it on adoption). It
//! outlives kernels (reset, eviction, idle reaping, daemon restarts) and
//! goes with the session's home. Strict kernels see it read-only at
//! [`PACKAGES_IN_SANDBOX`]; `none` kernels at its host path; the runner puts
//! it on `sys.path` ahead of site-packages at start, and `pipmagic` adds it
//! (and invalidates import caches) after an install.

mod line;
mod pip;
mod sandbox;

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::config::PackagesConfig;

pub(crate) use pip::serve;

/// The reserved request name on the tool socket (not a valid tool name).
pub(crate) const REQUEST: &str = "cellhost:pip";

/// Where strict kernels see their package dir (read-only).
pub const PACKAGES_IN_SANDBOX: &str = "/run/cellhost/packages";

/// How a kernel's `%pip` installs: where, under which policy.
#[derive(Debug, Clone)]
pub struct PackageOptions {
    /// The session's package dir on the host. `None`: next to the strict
    /// sandbox's workspace (see [`dir_for_workspace`]); a `none` kernel
    /// without one has no `%pip`.
    pub dir: Option<PathBuf>,
    /// pip's shared download cache (`None`: `pip-cache` beside the staging
    /// root).
    pub cache_dir: Option<PathBuf>,
    /// `[packages]`.
    pub policy: Arc<PackagesConfig>,
}

impl Default for PackageOptions {
    fn default() -> Self {
        PackageOptions {
            dir: None,
            cache_dir: None,
            policy: Arc::new(PackagesConfig::default()),
        }
    }
}

/// The package dir that goes with a workspace: `<home>/pkgs` for
/// `<home>/ws`, else `<workspace>.pkgs` beside it.
pub fn dir_for_workspace(ws: &Path) -> PathBuf {
    match (ws.file_name(), ws.parent()) {
        (Some(n), Some(parent)) if n == "ws" => parent.join("pkgs"),
        _ => {
            let mut name = ws.as_os_str().to_owned();
            name.push(".pkgs");
            PathBuf::from(name)
        }
    }
}

/// The current host path of a kernel handle's package dir (it moves when
/// a pooled kernel's dirs are handed to their owner).
pub(crate) type DirSlot = Arc<Mutex<Option<PathBuf>>>;

/// What serving `%pip` for one kernel handle needs. Shared by the handle's
/// processes and their tool servers.
#[derive(Debug)]
pub(crate) struct Installer {
    pub dir: DirSlot,
    /// The kernel's interpreter: pip installs for it.
    pub python: PathBuf,
    /// The kernel is strict: it sees the dir at [`PACKAGES_IN_SANDBOX`].
    pub strict: bool,
    /// The uid/gid pip runs as when the host is root (the package dir is
    /// theirs).
    pub uid: u32,
    pub gid: u32,
    pub policy: Arc<PackagesConfig>,
    pub cache: PathBuf,
    /// One `%pip` at a time per kernel handle.
    pub busy: tokio::sync::Mutex<()>,
}

impl Installer {
    /// The package dir's host path now.
    pub(crate) fn dir(&self) -> Option<PathBuf> {
        self.dir.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The package dir's host path now, made for pip's uid if missing
    /// (`None` when there is none, or it cannot be made).
    pub(crate) fn ensured_dir(&self) -> Option<PathBuf> {
        let dir = self.dir()?;
        ensure_dir(&dir, self.uid, self.gid).ok()?;
        Some(dir)
    }

    /// The path the kernel imports from.
    pub(crate) fn seen_at(&self, host: &Path) -> PathBuf {
        if self.strict {
            PathBuf::from(PACKAGES_IN_SANDBOX)
        } else {
            host.to_path_buf()
        }
    }
}

/// Create `dir` (0755, its missing parents 0700) for pip's uid, or check
/// that it is a real directory. Never follows a symlink at `dir`.
pub(crate) fn ensure_dir(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    if let Some(parent) = dir.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} is not a directory (symlinks are not followed)",
                dir.display()
            ),
        ));
    }
    if nix::unistd::geteuid().is_root() && meta.uid() == 0 {
        std::os::unix::fs::lchown(dir, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// Bytes under `dir`, never following symlinks.
pub(crate) fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match std::fs::symlink_metadata(e.path()) {
                Ok(m) if m.is_dir() => todo.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_package_dir_sits_beside_the_workspace() {
        assert_eq!(
            dir_for_workspace(Path::new("/d/workspaces/s-1/ws")),
            Path::new("/d/workspaces/s-1/pkgs")
        );
        assert_eq!(
            dir_for_workspace(Path::new("/d/workspaces/.pool-1-2-ab")),
            Path::new("/d/workspaces/.pool-1-2-ab.pkgs")
        );
    }

    #[test]
    fn sizes_do_not_follow_symlinks() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), [0u8; 100]).unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/b"), [0u8; 50]).unwrap();
        std::os::unix::fs::symlink("/usr", d.path().join("link")).unwrap();
        let n = dir_bytes(d.path());
        assert!((150..200).contains(&n), "{n}");
    }
}
