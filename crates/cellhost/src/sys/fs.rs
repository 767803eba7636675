//! Owner-only directories.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

/// Create `dir` (and parents) with mode 0700; an existing dir must be a
/// real directory (not a symlink) owned by us.
///
/// # Errors
/// The creation failed, or the dir or its parent belongs to someone else.
pub(crate) fn private_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a directory owned by this user", dir.display()),
        ));
    }
    // Its parent too: another user who owns it (a pre-created
    // /tmp/cellhost-<uid>) could swap `dir` for their own.
    if let Some(parent) = dir.parent() {
        let owner = std::fs::symlink_metadata(parent)?.uid();
        if owner != me && owner != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} belongs to another user (uid {owner}); remove it or choose another runtime dir",
                    parent.display()
                ),
            ));
        }
    }
    Ok(())
}
