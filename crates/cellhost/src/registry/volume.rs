//! Workspace volumes: each session's workspace on a filesystem of its own,
//! sized to the quota (`[limits] workspace_mib`), so the kernel's
//! filesystem stops a cell's writes with `ENOSPC` and no session can fill
//! the data dir's filesystem (which holds the history).
//!
//! A volume is `<home>/vol`: a sparse ext4 image `img` loop-mounted at
//! `fs`, holding the workspace `fs/ws` and the package dir `fs/pkgs` (both
//! count against the quota; the spill files live in the workspace). The
//! sandbox binds `fs/ws` and `fs/pkgs`, whose mountinfo roots are `/ws`
//! and `/pkgs`: no host path.
//!
//! Cheap to make: `mkfs.ext4` runs once per manager root and size into a
//! template (`<root>/.template-<quota bytes>.img`), copied per volume by its data
//! extents only (a few hundred KiB); inode tables are never initialised
//! (`lazy_itable_init` with `noinit_itable`), so an image stays sparse.
//!
//! The mount outlives a reset; an evicted or reaped session's volume is
//! detached once it has no kernel (so many sessions over few kernels hold
//! few mounts) and mounted again by its next cell or file call; a restart
//! finds the image and mounts it again; a SIGKILLed daemon's mounts are
//! found mounted and reused. Disposal and shutdown detach them; the loop
//! devices (autoclear) go with their last mount.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::sys::mount;

/// `<home>/vol`, the volume of a home.
pub(crate) const VOLUME: &str = "vol";
const IMAGE: &str = "img";
const FS: &str = "fs";

/// Serialises volume set-up within this process (template, copy, mount).
static LOCK: Mutex<()> = Mutex::new(());

const MIB: u64 = 1024 * 1024;

/// Why this host cannot have workspace volumes (`None`: it can).
pub(crate) fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("the daemon is not root (loop mounts need it)".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("the host has no loop devices (/dev/loop-control)".into());
    }
    for tool in ["mkfs.ext4", "dumpe2fs", "tune2fs"] {
        if crate::sandbox::launch::find_program(tool).is_none() {
            return Some(format!("{tool} is not installed (e2fsprogs)"));
        }
    }
    None
}

/// The volume dir a workspace dir `…/vol/fs/ws` lies in, if it does.
pub(crate) fn of_workspace(ws: &Path) -> Option<&Path> {
    let fs = ws.parent()?;
    let vol = fs.parent()?;
    (ws.file_name()? == "ws" && fs.file_name()? == FS).then_some(vol)
}

/// The workspace inside a volume dir.
pub(crate) fn workspace_in(vol: &Path) -> PathBuf {
    vol.join(FS).join("ws")
}

/// Image bytes for `quota`: ext4's metadata (journal, inode tables, group
/// descriptors) on top, so the workspace holds at least `quota` bytes.
fn image_bytes(quota: u64) -> u64 {
    (quota + quota / 32 + 8 * MIB).div_ceil(4096) * 4096
}

/// Make sure the volume `vol` is mounted at `vol/fs`: mounted already (a
/// previous daemon SIGKILLed), its image mounted again (a restart), or a
/// new one made from the template.
///
/// # Errors
/// The image could not be made or mounted.
pub(crate) fn ensure(root: &Path, vol: &Path, quota: u64) -> io::Result<()> {
    with_mounted(root, vol, quota, || Ok(()))
}

/// [`ensure`], then `then` while the volume cannot be detached: what it
/// makes in the workspace lands in the volume, never in the mount point's
/// directory underneath.
///
/// # Errors
/// The image could not be made or mounted, or `then` failed.
pub(crate) fn with_mounted(
    root: &Path,
    vol: &Path,
    quota: u64,
    then: impl FnOnce() -> io::Result<()>,
) -> io::Result<()> {
    let _held = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    mount_locked(root, vol, quota)?;
    then()
}

/// Detach the volume `vol` unless `in_use` (asked under the same lock as
/// every mount, so a kernel starting or a file call creating the
/// workspace meanwhile is never left on the bare mount point). Returns
/// whether it was detached. A kernel still dying keeps its sandbox's bind
/// until it is gone; a file call holding the workspace open keeps working
/// on the detached filesystem.
pub(crate) fn release(vol: &Path, in_use: impl FnOnce() -> bool) -> bool {
    let _held = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let fs = vol.join(FS);
    if !mount::is_mount_point(&fs) || in_use() {
        return false;
    }
    mount::unmount_under(&fs) > 0
}

fn mount_locked(root: &Path, vol: &Path, quota: u64) -> io::Result<()> {
    let fs = vol.join(FS);
    if mount::is_mount_point(&fs) {
        return Ok(());
    }
    let mut dirs = std::fs::DirBuilder::new();
    dirs.recursive(true).mode(0o700);
    dirs.create(&fs)?;
    let image = vol.join(IMAGE);
    let fresh = std::fs::symlink_metadata(&image).is_err();
    if fresh {
        let template = template(root, quota)?;
        let tmp = vol.join(format!("{IMAGE}.tmp"));
        sparse_copy(&template, &tmp)?;
        std::fs::rename(&tmp, &image)?;
    }
    mount::mount_image(
        &image,
        &fs,
        "ext4",
        "noinit_itable,errors=remount-ro",
        fresh,
    )?;
    // The fs root is root's alone: kernels see only the dirs bound in.
    std::fs::set_permissions(&fs, std::fs::Permissions::from_mode(0o700))?;
    let _ = std::fs::remove_dir(fs.join("lost+found"));
    Ok(())
}

/// Reserve (for root, as ext4's reserved blocks) every free block beyond
/// `quota`: a kernel (never root) fills exactly its quota, whatever the
/// metadata took.
fn reserve_beyond(image: &Path, quota: u64) -> io::Result<()> {
    let tool =
        |name: &str| crate::sandbox::launch::find_program(name).unwrap_or_else(|| name.into());
    let out = std::process::Command::new(tool("dumpe2fs"))
        .arg("-h")
        .arg(image)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    let (Some(free), Some(block)) = (field("Free blocks:"), field("Block size:")) else {
        return Err(io::Error::other("dumpe2fs: no free block count"));
    };
    // tune2fs refuses to reserve more than half the blocks: a tiny quota
    // (a few MiB, where the metadata is most of the image) gets a little
    // more than it asked for.
    let half = field("Block count:").unwrap_or(0) / 2;
    let reserved = free
        .saturating_sub(quota.div_ceil(block))
        .min(half.saturating_sub(1));
    let out = std::process::Command::new(tool("tune2fs"))
        .arg("-r")
        .arg(reserved.to_string())
        .arg(image)
        .stdin(std::process::Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "tune2fs failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// `<root>/.template-<quota bytes>.img`, made once with `mkfs.ext4`.
fn template(root: &Path, quota: u64) -> io::Result<PathBuf> {
    let bytes = image_bytes(quota);
    let path = root.join(format!(".template-{quota}.img"));
    if path.exists() {
        return Ok(path);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)?;
    let tmp = root.join(format!(
        ".template-{bytes}.img.{}-{}",
        std::process::id(),
        crate::sys::random_hex(4)
    ));
    let made = (|| {
        std::fs::File::create(&tmp)?.set_len(bytes)?;
        let out = std::process::Command::new(
            crate::sandbox::launch::find_program("mkfs.ext4").unwrap_or_else(|| "mkfs.ext4".into()),
        )
        .args([
            "-q",
            "-F",
            "-m",
            "0",
            "-i",
            "32768",
            "-O",
            "^resize_inode",
            "-E",
            "nodiscard,lazy_itable_init=1,lazy_journal_init=1",
            "-L",
            "cellhost-ws",
        ])
        .arg(&tmp)
        .stdin(std::process::Stdio::null())
        .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "mkfs.ext4 failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        reserve_beyond(&tmp, quota)?;
        std::fs::rename(&tmp, &path)
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    made.map(|()| path)
}

/// Copy `from` to a new file `to` of the same size, data extents only
/// (`SEEK_DATA`/`SEEK_HOLE`): the copy is as sparse as the template.
fn sparse_copy(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let src = std::fs::File::open(from)?;
    let len = src.metadata()?.len();
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(to)?;
    dst.set_len(len)?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut at: i64 = 0;
    while (at as u64) < len {
        // SAFETY: lseek on an open fd.
        let data = unsafe { libc::lseek(src.as_raw_fd(), at, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole is left
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(src.as_raw_fd(), data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut pos = data as u64;
        while pos < hole as u64 {
            let want = ((hole as u64 - pos) as usize).min(buf.len());
            let n = src.read_at(&mut buf[..want], pos)?;
            if n == 0 {
                break;
            }
            dst.write_all_at(&buf[..n], pos)?;
            pos += n as u64;
        }
        at = hole;
    }
    dst.sync_all()
}

/// Detach every volume under `root` but those of live other hosts' pools
/// (manager shutdown: nothing of ours stays mounted).
pub(crate) fn unmount_all(root: &Path, keep: impl Fn(&Path) -> bool, wait: bool) -> usize {
    let mut n = 0;
    for m in mount::mounts_under(root) {
        if !keep(&m) {
            n += mount::unmount_under(&m);
        }
    }
    // The loop devices clear themselves once the dead kernels' namespaces
    // let go of their binds: wait for that (briefly), so nothing of ours
    // is attached when the manager is gone.
    for _ in 0..if wait { 100 } else { 0 } {
        if mount::loops_under(root).iter().all(|f| keep(f)) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspaces_in_volumes_are_recognised() {
        let vol = Path::new("/r/s-1/vol");
        assert_eq!(of_workspace(&workspace_in(vol)), Some(vol));
        assert_eq!(of_workspace(Path::new("/r/s-1/ws")), None);
        assert!(image_bytes(MIB) >= MIB + 8 * MIB && image_bytes(MIB).is_multiple_of(4096));
    }
}
