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
