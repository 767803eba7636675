//! A kernel's staging dir `<runtime>/kernels/k-<id>` (0700): the runner's
//! files, the tool and egress sockets and the generated `/etc` files.
//!
//! Under the strict profile on a root host the dir is a tmpfs of its own,
//! so the sandbox's read-only bind of it shows root `/` of a filesystem
//! named `cellhost` in `/proc/self/mountinfo`, not the runtime dir or the
//! kernel id. The `.host` mark is written under the mount as well as in
//! it, so recovery finds the host of a dir whose tmpfs died with the
//! host's mount namespace. [`remove`] detaches the tmpfs first.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::record::ProcessId;
use crate::sys::mount;

/// Create `root/id`; `tmpfs`: mount a tmpfs on it.
pub(crate) fn create(root: &Path, id: &str, tmpfs: bool) -> io::Result<PathBuf> {
    let dir = root.join(id);
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    let made = (|| {
        ProcessId::mark_staging(&dir)?;
        if tmpfs {
            mount::mount_tmpfs(&dir, "mode=0700")?;
            ProcessId::mark_staging(&dir)?;
        }
        Ok(())
    })();
    match made {
        Ok(()) => Ok(dir),
        Err(e) => {
            remove(&dir);
            Err(e)
        }
    }
}

/// Detach the dir's tmpfs, if it has one, and remove the dir.
pub(crate) fn remove(dir: &Path) {
    let _ = mount::remove_dir(dir);
}

/// A staging dir that is removed when dropped, until [`Staged::keep`]
/// hands it to the process that owns it from then on: a start cancelled
/// part way (its caller gave up, or the host shut down, and the future
/// was dropped) leaves no dir behind.
pub(crate) struct Staged(Option<PathBuf>);

impl Staged {
    pub(crate) fn new(dir: PathBuf) -> Staged {
        Staged(Some(dir))
    }

    pub(crate) fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }

    /// The dir, no longer removed by this guard.
    pub(crate) fn keep(mut self) -> PathBuf {
        self.0.take().unwrap_or_default()
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            remove(&dir);
        }
    }
}
