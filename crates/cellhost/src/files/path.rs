//! Path safety: every name a client gives is resolved beneath the
//! workspace root one component at a time, each opened with `O_NOFOLLOW`
//! relative to its parent's fd, so no symlink (a cell may plant
//! `leak -> /etc/shadow`, `root -> /`, or a symlinked parent dir) and no
//! `..` ever leads the daemon (root) out of the workspace. Files are
//! opened `O_NONBLOCK` and checked with `fstat` before use: a planted FIFO
//! never hangs the daemon, and FIFOs, sockets and devices are refused.
//!
//! Everything here is blocking (plain syscalls): callers run it on the
//! blocking pool.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::FileError;

/// Longest path a client may name, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;
/// Longest single name (the kernel's `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;

/// A validated relative path: non-empty components without `/`, `.`,
/// `..` or NUL. Empty means the workspace root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelPath {
    parts: Vec<String>,
    /// Written with a trailing `/`: it must be a directory.
    dir: bool,
}

impl RelPath {
    /// Check a client's path. A trailing `/` and repeated `/` are allowed
    /// (`dir/`, `a//b`); a leading `/`, `.`, `..`, NUL and over-long names
    /// are refused with `invalid_path`.
    pub fn parse(raw: &str) -> Result<RelPath, FileError> {
        let bad = |why: &str| FileError::InvalidPath {
            path: shorten(raw),
            why: why.to_owned(),
        };
        if raw.contains('\0') {
            return Err(bad("it contains a NUL byte"));
        }
        if raw.starts_with('/') {
            return Err(bad(
                "it is absolute; name files relative to the workspace (e.g. data/sales.csv)",
            ));
        }
        if raw.len() > MAX_PATH_BYTES {
            return Err(bad(&format!(
                "it is {} bytes long; paths may have at most {MAX_PATH_BYTES}",
                raw.len()
            )));
        }
        let mut parts = Vec::new();
        for part in raw.split('/').filter(|p| !p.is_empty()) {
            match part {
                "." | ".." => return Err(bad(
                    "it contains `.` or `..`; name files by their plain path inside the workspace",
                )),
                p if p.len() > MAX_NAME_BYTES => {
                    return Err(bad(&format!(
                        "a name in it is {} bytes long; names may have at most {MAX_NAME_BYTES}",
                        p.len()
                    )))
                }
                p => parts.push(p.to_owned()),
            }
        }
        Ok(RelPath {
            parts,
            dir: raw.ends_with('/'),
        })
    }

    /// Named with a trailing `/` (must be a directory).
    pub fn names_dir(&self) -> bool {
        self.dir
    }

    /// No components: the workspace root itself.
    pub fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    /// The components, root first; each non-empty, without `/`, NUL,
    /// `.` or `..`, at most [`MAX_NAME_BYTES`] long.
    pub fn parts(&self) -> &[String] {
        &self.parts
    }

    /// The parent's components and the last name (`None` for the root).
    pub fn split_last(&self) -> Option<(&[String], &str)> {
        let (last, parents) = self.parts.split_last()?;
        Some((parents, last.as_str()))
    }

    /// `a/b/c`, as the API names it.
    pub fn display(&self) -> String {
        self.parts.join("/")
    }

    /// This path with `name` appended as one more component (not
    /// validated: `name` comes from a directory read, never a client).
    /// The result does not name a directory.
    pub fn join(&self, name: &str) -> RelPath {
        let mut parts = self.parts.clone();
        parts.push(name.to_owned());
        RelPath { parts, dir: false }
    }
}

/// At most 200 characters of a path, for messages (a 4 KiB name must not
/// make a 4 KiB error).
fn shorten(raw: &str) -> String {
    match raw.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &raw[..i]),
        None => raw.to_owned(),
    }
}

fn cstr(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY)`.
pub(crate) fn open_at(
    dir: RawFd,
    name: &CStr,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY;
    loop {
        // SAFETY: a valid dir fd (or AT_FDCWD) and a NUL-terminated name.
        let fd = unsafe { libc::openat(dir, name.as_ptr(), flags, mode as libc::c_uint) };
        if fd >= 0 {
            // SAFETY: a fresh fd we own.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// `fstat(fd)`.
pub(crate) fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and a valid out-pointer.
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: what sits at `name`, never
/// what a symlink there points to.
pub(crate) fn lstat_at(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: as in `fstat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid dir fd, a NUL-terminated name, a valid out-pointer.
    check(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

/// The kind of a `stat`'s file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed).
    Symlink,
    /// FIFO, socket, device: refused.
    Special,
}

pub(crate) fn kind_of(st: &libc::stat) -> Kind {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Kind::File,
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink,
        _ => Kind::Special,
    }
}

/// The workspace root, opened without following a symlink at it.
pub(crate) fn open_root(root: &Path) -> io::Result<OwnedFd> {
    let path = CString::new(root.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    open_at(libc::AT_FDCWD, &path, libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

/// Map an errno met while resolving `path` to the API's error.
pub(crate) fn resolve_error(path: &RelPath, err: io::Error) -> FileError {
    let path_s = path.display();
    match err.raw_os_error() {
        Some(libc::ENOENT) => FileError::NotFound { path: path_s },
        Some(libc::ELOOP) => FileError::InvalidPath {
            path: path_s,
            why: "it is or passes through a symlink, and symlinks in the workspace are never \
                  followed; name the real file"
                .into(),
        },
        Some(libc::ENOTDIR) => FileError::NotADirectory { path: path_s },
        Some(libc::ENAMETOOLONG) => FileError::InvalidPath {
            path: path_s,
            why: "it is too long".into(),
        },
        _ => FileError::Io {
            about: "open a workspace path",
            err,
        },
    }
}

/// Open the directory at `parts` beneath `root`, each component with
/// `O_NOFOLLOW | O_DIRECTORY`: a symlink anywhere fails (`ELOOP` or
/// `ENOTDIR`), so the walk never leaves the root. With `create`, missing
/// directories are made (mode 0755, owned by `owner`).
pub(crate) fn walk_dirs(
    root: &OwnedFd,
    parts: &[String],
    create: Option<(u32, u32)>,
) -> io::Result<OwnedFd> {
    let mut dir = dup(root)?;
    for part in parts {
        let name = cstr(part)?;
        let next = match open_at(
            dir.as_raw_fd(),
            &name,
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create.is_some() => {
                let (uid, gid) = create.unwrap_or_default();
                // SAFETY: a valid dir fd and a NUL-terminated name.
                match check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) }) {
                    Ok(_) => {}
                    // Made meanwhile (a cell, a parallel upload): open it.
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                    Err(e) => return Err(e),
                }
                let made = open_at(
                    dir.as_raw_fd(),
                    &name,
                    libc::O_RDONLY | libc::O_DIRECTORY,
                    0,
                )?;
                own(&made, uid, gid, 0o755)?;
                made
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                // A symlink (to a dir or not) says so, not "not a directory".
                let link =
                    lstat_at(dir.as_raw_fd(), &name).is_ok_and(|st| kind_of(&st) == Kind::Symlink);
                return Err(if link {
                    io::Error::from_raw_os_error(libc::ELOOP)
                } else {
                    e
                });
            }
            other => other?,
        };
        dir = next;
    }
    Ok(dir)
}

fn dup(fd: &OwnedFd) -> io::Result<OwnedFd> {
    fd.try_clone()
}

/// `fchown` + `fchmod` on the fd (never a path: nothing can be swapped in).
pub(crate) fn own(fd: &OwnedFd, uid: u32, gid: u32, mode: u32) -> io::Result<()> {
    // SAFETY: a valid fd.
    let st = fstat(fd.as_raw_fd())?;
    if st.st_uid != uid || st.st_gid != gid {
        // SAFETY: a valid fd.
        check(unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) })?;
    }
    // After the chown, which clears setuid/setgid bits anyway.
    // SAFETY: a valid fd.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) })?;
    Ok(())
}

/// Open a regular file beneath the root for reading: `O_NONBLOCK` (a FIFO
/// opens without waiting for a writer), then `fstat`; a directory is
/// answered as such, anything but a regular file is refused.
pub(crate) fn open_read(root: &OwnedFd, path: &RelPath) -> Result<Opened, FileError> {
    let Some((parents, last)) = path.split_last() else {
        let _ = root;
        return Ok(Opened::Dir);
    };
    let dir = walk_dirs(root, parents, None).map_err(|e| resolve_error(path, e))?;
    let name = cstr(last).map_err(|e| resolve_error(path, e))?;
    let fd = open_at(dir.as_raw_fd(), &name, libc::O_RDONLY | libc::O_NONBLOCK, 0)
        .map_err(|e| resolve_error(path, e))?;
    let st = fstat(fd.as_raw_fd()).map_err(|err| FileError::Io {
        about: "stat a workspace file",
        err,
    })?;
    match kind_of(&st) {
        Kind::File if path.names_dir() => Err(FileError::NotADirectory {
            path: path.display(),
        }),
        Kind::File => Ok(Opened::File(fd, st)),
        Kind::Dir => Ok(Opened::Dir),
        _ => Err(FileError::NotRegular {
            path: path.display(),
        }),
    }
}

/// A path opened for reading.
pub(crate) enum Opened {
    File(OwnedFd, libc::stat),
    Dir,
}

/// Read the entries of a directory fd (not `.`/`..`), each with what
/// `fstatat(AT_SYMLINK_NOFOLLOW)` says of it. Stops after `max`.
pub(crate) fn read_dir(dir: &OwnedFd, max: usize) -> io::Result<(Vec<(String, libc::stat)>, bool)> {
    let fd = dup(dir)?;
    let mut d = nix::dir::Dir::from_fd(fd).map_err(io::Error::from)?;
    let mut out = Vec::new();
    let mut more = false;
    for entry in d.iter() {
        let entry = entry.map_err(io::Error::from)?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        if out.len() >= max {
            more = true;
            break;
        }
        let Ok(st) = lstat_at(dir.as_raw_fd(), name) else {
            continue; // gone meanwhile
        };
        out.push((String::from_utf8_lossy(name.to_bytes()).into_owned(), st));
    }
    Ok((out, more))
}

/// Remove `name` in `dir`; a directory with everything in it when
/// `recursive`. Symlinks are unlinked, never followed; directories are
/// entered by fd with `O_NOFOLLOW`.
pub(crate) fn remove_at(
    dir: &OwnedFd,
    name: &CStr,
    recursive: bool,
    depth: usize,
) -> io::Result<()> {
    let st = lstat_at(dir.as_raw_fd(), name)?;
    if kind_of(&st) != Kind::Dir {
        // SAFETY: a valid dir fd and a NUL-terminated name.
        check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) })?;
        return Ok(());
    }
    if recursive {
        if depth > 256 {
            return Err(io::Error::other(
                "directories are nested more than 256 deep",
            ));
        }
        let sub = open_at(dir.as_raw_fd(), name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        loop {
            let (entries, more) = read_dir(&sub, 1024)?;
            for (child, _) in &entries {
                let child = cstr(child)?;
                match remove_at(&sub, &child, true, depth + 1) {
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    other => other?,
                }
            }
            if !more || entries.is_empty() {
                break;
            }
        }
    }
    // SAFETY: a valid dir fd and a NUL-terminated name.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) })?;
    Ok(())
}

/// `renameat(dir, from, dir, to)`: replaces a file (or a symlink, itself)
/// at `to`, never what a symlink points to.
pub(crate) fn rename_in(dir: &OwnedFd, from: &CStr, to: &CStr) -> io::Result<()> {
    // SAFETY: valid dir fds and NUL-terminated names.
    check(unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), to.as_ptr()) })?;
    Ok(())
}

pub(crate) fn name(part: &str) -> io::Result<CString> {
    cstr(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_paths_are_invalid_and_good_ones_split() {
        for bad in [
            "/etc/passwd",
            "../x",
            "a/../../b",
            "a/./b",
            ".",
            "a\0b",
            &"x".repeat(4096),
            &format!("d/{}", "n".repeat(256)),
        ] {
            let err = RelPath::parse(bad).unwrap_err();
            assert_eq!(err.code(), "invalid_path", "{bad:.40}");
            assert!(err.to_string().len() < 600, "short message");
        }
        let p = RelPath::parse("data//sales.csv/").unwrap();
        assert_eq!(p.parts(), ["data", "sales.csv"]);
        assert_eq!(p.display(), "data/sales.csv");
        assert!(RelPath::parse("").unwrap().is_root());
        assert!(RelPath::parse(".hidden/x..y").is_ok());
    }
}
