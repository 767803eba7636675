//! Cut output spilled into the workspace, at
//! `.cellhost/output/cell-<n>.<stream>.txt`, where the next cell can open
//! it (`/workspace/.cellhost/output/…` in the strict sandbox) and a client
//! can download it (`GET …/files/.cellhost/output/…`).
//!
//! The cell owns the workspace, so the write goes through the path rules:
//! `.cellhost` planted as a symlink is refused, never followed. The files
//! belong to the workspace's owner. Only the newest [`KEEP`] files stay:
//! a session that prints megabytes in every cell does not fill its disk.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;

use super::path;

/// Spill files kept per workspace (older ones are removed).
pub const KEEP: usize = 20;
/// Where in the workspace spill files go.
pub(crate) const DIR: &str = ".cellhost/output";

/// Write `text` to `<root>/.cellhost/output/<name>` and prune older spill
/// files. Returns the path relative to the workspace root.
pub(crate) fn write(root: &Path, name: &str, text: &str) -> std::io::Result<String> {
    let root_fd = path::open_root(root)?;
    let st = path::fstat(root_fd.as_raw_fd())?;
    let owner = (st.st_uid, st.st_gid);
    let parts: Vec<String> = DIR.split('/').map(str::to_owned).collect();
    let dir = path::walk_dirs(&root_fd, &parts, Some(owner))?;
    let tmp = path::name(&format!(
        "{}{}",
        super::local::UPLOAD_PREFIX,
        crate::kernel::random_hex(8)
    ))?;
    let fd = path::open_at(
        dir.as_raw_fd(),
        &tmp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o600,
    )?;
    let written = path::own(&fd, owner.0, owner.1, 0o644).and_then(|()| {
        let mut f = std::fs::File::from(fd);
        f.write_all(text.as_bytes())
    });
    let target = path::name(name)?;
    let done = written.and_then(|()| path::rename_in(&dir, &tmp, &target));
    if let Err(e) = done {
        // SAFETY: a valid dir fd and a NUL-terminated name.
        unsafe { libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0) };
        return Err(e);
    }
    prune(&dir, KEEP);
    Ok(format!("{DIR}/{name}"))
}

/// Keep the newest `keep` `cell-*` files in `dir`.
fn prune(dir: &std::os::fd::OwnedFd, keep: usize) {
    let Ok((entries, _)) = path::read_dir(dir, 10_000) else {
        return;
    };
    let mut spills: Vec<_> = entries
        .into_iter()
        .filter(|(n, st)| n.starts_with("cell-") && path::kind_of(st) == path::Kind::File)
        .map(|(n, st)| ((st.st_mtime, st.st_mtime_nsec), n))
        .collect();
    if spills.len() <= keep {
        return;
    }
    spills.sort();
    let excess = spills.len() - keep;
    for (_, name) in spills.into_iter().take(excess) {
        if let Ok(n) = path::name(&name) {
            let _ = path::remove_at(dir, &n, false, 0);
        }
    }
}
