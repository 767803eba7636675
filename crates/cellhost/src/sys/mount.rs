//! Loop-mounted filesystem images (the per-session workspace volumes):
//! attach an image to a free loop device with `LO_FLAGS_AUTOCLEAR` and
//! mount it; find and detach mounts under a directory.
//!
//! The loop device is configured with autoclear and our fd closed once the
//! mount holds it: the device frees itself when the last mount of it goes,
//! in whichever mount namespace (a sandbox's bind of the volume) that is.
//! A failed mount frees it too. Nothing here ever leaves a device that no
//! mount uses. Direct I/O where the backing filesystem has it.

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;

#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Attach `image` to a free loop device (autoclear) and mount it at
/// `target` as `fstype` with `data` options, `nosuid,nodev`. `fresh`: the
/// image was just made, so no device can be backing it yet (the look for
/// one reads every loop device's backing file: ~9 ms with the 1,000
/// devices a host that served 1,000 sessions at once keeps).
///
/// # Errors
/// No loop device could be had, or the mount failed (the device is freed).
pub(crate) fn mount_image(
    image: &Path,
    target: &Path,
    fstype: &str,
    data: &str,
    fresh: bool,
) -> io::Result<()> {
    // A device still backing the image (its last mount detached, and a
    // dying sandbox's namespace not yet gone) holds a live superblock:
    // mount that device again, so the image never has two filesystems
    // writing it. Should it clear meanwhile, attach afresh.
    if let Some(dev) = (!fresh).then(|| loop_of(image)).flatten() {
        if let Ok(pin) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&dev)
        {
            let still = loop_of(image).as_deref() == Some(dev.as_path());
            if still && mount_dev(&dev, target, fstype, data).is_ok() {
                drop(pin);
                return Ok(());
            }
        }
    }
    let backing = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(image)?;
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/loop-control")?;
    // Another process may take the device we were offered: ask again.
    for _ in 0..64 {
        // SAFETY: an ioctl on an open fd, without argument.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let dev = PathBuf::from(format!("/dev/loop{n}"));
        let device = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&dev)
        {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        // SAFETY: all-zero is a valid loop_config.
        let mut config: LoopConfig = unsafe { std::mem::zeroed() };
        config.fd = backing.as_raw_fd() as u32;
        // Direct I/O: the image's pages are not cached twice (in the
        // volume's filesystem and the backing file's), which halves a
        // big write's cost; a backing filesystem without it gets buffered.
        config.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
        let name = image.as_os_str().as_bytes();
        let len = name.len().min(63);
        config.info.lo_file_name[..len].copy_from_slice(&name[..len]);
        // SAFETY: a valid loop_config for the device's fd.
        let mut r = unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CONFIGURE as _, &config) };
        if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
            // SAFETY: as above.
            r = unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CONFIGURE as _, &config) };
        }
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EBUSY) {
                continue;
            }
            return Err(e);
        }
        let mounted = mount_dev(&dev, target, fstype, data);
        // Dropping `device` now: with autoclear the mount keeps it (or,
        // on failure, the device is freed here).
        drop(device);
        return mounted;
    }
    Err(io::Error::new(
        io::ErrorKind::ResourceBusy,
        "no free loop device",
    ))
}

fn mount_dev(dev: &Path, target: &Path, fstype: &str, data: &str) -> io::Result<()> {
    mount_fs(
        &cstr(dev)?,
        target,
        fstype,
        libc::MS_NOSUID | libc::MS_NODEV,
        data,
    )
}

/// `mount(2)` of a filesystem `fstype` from `source` at `target`.
fn mount_fs(
    source: &CString,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let invalid = |_| io::Error::from(io::ErrorKind::InvalidInput);
    let (dst, fs, opts) = (
        cstr(target)?,
        CString::new(fstype).map_err(invalid)?,
        CString::new(data).map_err(invalid)?,
    );
    // SAFETY: valid NUL-terminated strings.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            dst.as_ptr(),
            fs.as_ptr(),
            flags,
            opts.as_ptr().cast(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The loop device backed by `image`, if one is attached.
fn loop_of(image: &Path) -> Option<PathBuf> {
    let rd = std::fs::read_dir("/sys/block").ok()?;
    rd.flatten().find_map(|e| {
        let f = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
        (Path::new(f.trim_end_matches('\n')) == image)
            .then(|| PathBuf::from("/dev").join(e.file_name()))
    })
}

/// `true` when `path` is the root of a mount (not through a symlink).
pub(crate) fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(me), Some(parent)) = (std::fs::symlink_metadata(path), path.parent()) else {
        return false;
    };
    if !me.is_dir() {
        return false;
    }
    match std::fs::symlink_metadata(parent) {
        Ok(up) => up.dev() != me.dev() || up.ino() == me.ino(),
        Err(_) => false,
    }
}

/// Mount points at or under `dir` in this mount namespace, deepest first.
pub(crate) fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

/// mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Backing files under `dir` of attached loop devices.
pub(crate) fn loops_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .map(|f| PathBuf::from(f.trim_end_matches('\n').trim_end_matches(" (deleted)")))
        .filter(|f| f.starts_with(dir))
        .collect()
}

/// Detach every mount at or under `dir` (lazily: a sandbox's own bind of
/// it lives on until its kernel dies). Returns how many were detached.
pub(crate) fn unmount_under(dir: &Path) -> usize {
    let mut n = 0;
    // A path can carry stacked mounts: detach until none is left.
    for _ in 0..4 {
        let found = mounts_under(dir);
        if found.is_empty() {
            break;
        }
        for m in found {
            if detach(&m) {
                n += 1;
            }
        }
    }
    n
}

/// Mount a fresh tmpfs at `target` (`nosuid,nodev,noexec`), its source
/// named `cellhost`: a sandbox's bind of it shows root `/` and that name in
/// its mountinfo, never a host path.
pub(crate) fn mount_tmpfs(target: &Path, data: &str) -> io::Result<()> {
    let source = CString::new("cellhost").expect("no NUL");
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    mount_fs(&source, target, "tmpfs", flags, data)
}

/// Detach the mount at `path` (lazily, never through a symlink); a path
/// that is no mount point is left as it is. True when one was detached.
pub(crate) fn detach(path: &Path) -> bool {
    let Ok(c) = cstr(path) else { return false };
    // SAFETY: a valid NUL-terminated path.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) == 0 }
}

/// Detach `dir`'s own mount, if it has one (a tmpfs), and remove it.
pub(crate) fn remove_dir(dir: &Path) -> io::Result<()> {
    detach(dir);
    std::fs::remove_dir_all(dir)
}

/// Move this process into a mount namespace of its own, a slave of the
/// host's: the host's mounts still appear here, ours never propagate back.
/// The workspace volumes a host mounts from then on live exactly as long
/// as it and its kernels: a host that is SIGKILLed leaves none mounted
/// (the kernel tears the namespace down, the loop devices clear
/// themselves), and the next start mounts the images again.
///
/// Call it before any thread starts: `unshare(CLONE_NEWNS)` implies
/// `CLONE_FS`, which a multi-threaded process cannot unshare.
///
/// # Errors
/// Not root, or the kernel refused (`unshare` or the propagation change).
pub fn private_mount_namespace() -> io::Result<()> {
    // SAFETY: plain syscalls with valid arguments; no memory is shared.
    if unsafe { libc::geteuid() } != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "only root has a mount namespace of its own",
        ));
    }
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let root = CString::new("/").expect("no NUL");
    // SAFETY: a NUL-terminated path; null source, type and data are allowed
    // for a propagation change.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A detached copy of the mounts at and under `path` (a recursive bind
/// that is attached nowhere yet), `nosuid,nodev` and, with `read_only`,
/// read-only: another mount namespace's process moves it into place with
/// `move_mount` (a strict template's fork, `runner/strictfork.py`). Closing
/// the fd unattached dissolves it. Never follows a symlink at `path`.
///
/// # Errors
/// The path, or the kernel (before 5.12, or without the privilege).
pub(crate) fn detached_bind(path: &Path, read_only: bool) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let c = cstr(path)?;
    let flags = OPEN_TREE_CLONE
        | libc::O_CLOEXEC as libc::c_uint
        | libc::AT_RECURSIVE as libc::c_uint
        | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint;
    // SAFETY: a NUL-terminated path; open_tree returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd that nothing else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_NOSUID
            | MOUNT_ATTR_NODEV
            | if read_only { MOUNT_ATTR_RDONLY } else { 0 },
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let empty = CString::default();
    // SAFETY: the fd is ours, the path empty (AT_EMPTY_PATH), the attr
    // struct valid for its size.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            empty.as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape("/a\\040b/c"), "/a b/c");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/x\\"), "/x\\");
    }
}
