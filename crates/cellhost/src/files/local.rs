//! The workspace on this host: [`Local`], every operation through an
//! `openat` walk from the workspace's root fd (`path.rs`), on the blocking
//! pool, with the bytes moving through tokio files in chunks, so memory
//! per transfer stays at one chunk whatever the file's size.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::Digest;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::handle::{FileReader, Opened, Source, WriteLimits};
use super::path::{self, Kind, RelPath};
use super::{Entry, EntryType, FileError, Listing, Written};

/// Bytes moved per read.
const CHUNK: usize = 256 * 1024;
/// Prefix of in-progress uploads (renamed into place when complete).
pub(crate) const UPLOAD_PREFIX: &str = ".cellhost-upload-";
const MIB: u64 = 1024 * 1024;

/// How the workspace directory is reached, and made when missing (the
/// manager knows whose it is: the strict kernel's uid, or the host user;
/// and whether it lies in a volume that may need mounting).
pub type Prepare = Arc<dyn Fn(&Path, Need) -> io::Result<()> + Send + Sync>;

/// What a [`Prepare`] is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Make an existing workspace reachable (mount its volume, detached
    /// while the session had no kernel); never create it.
    Reach,
    /// Reach it, and create it when missing.
    Create,
}

/// One owner's workspace on this host.
#[derive(Clone)]
pub(crate) struct Local {
    root: PathBuf,
    in_kernel: PathBuf,
    quota: Option<u64>,
    prepare: Prepare,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalWorkspace")
            .field("root", &self.root)
            .field("in_kernel", &self.in_kernel)
            .field("quota", &self.quota)
            .finish_non_exhaustive()
    }
}

fn blocking_err(_: tokio::task::JoinError) -> FileError {
    FileError::Io {
        about: "run a workspace operation",
        err: io::Error::other("the blocking task failed"),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, FileError> + Send + 'static,
) -> Result<T, FileError> {
    tokio::task::spawn_blocking(f).await.map_err(blocking_err)?
}

pub(super) fn io_err(about: &'static str) -> impl FnOnce(io::Error) -> FileError {
    move |err| FileError::Io { about, err }
}

fn modified(st: &libc::stat) -> f64 {
    st.st_mtime as f64 + st.st_mtime_nsec as f64 / 1e9
}

impl Local {
    pub(crate) fn new(
        root: PathBuf,
        in_kernel: PathBuf,
        quota: Option<u64>,
        prepare: Prepare,
    ) -> Local {
        Local {
            root,
            in_kernel,
            quota,
            prepare,
        }
    }

    /// The workspace directory on this host.
    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// Where the kernel sees the workspace (`/workspace` in the strict
    /// sandbox; the host path otherwise).
    pub(super) fn in_kernel(&self) -> &Path {
        &self.in_kernel
    }

    /// The quota in bytes (`None`: unlimited).
    pub(super) fn quota(&self) -> Option<u64> {
        self.quota
    }

    /// The root fd, or `None` when the workspace was never made. A missing
    /// root may be a detached volume's: reached again, then opened.
    fn root_fd(&self) -> Result<Option<OwnedFd>, FileError> {
        let open = || match path::open_root(&self.root) {
            Ok(fd) => Ok(Some(fd)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(err) => Err(FileError::Io {
                about: "open the workspace",
                err,
            }),
        };
        if let Some(fd) = open()? {
            return Ok(Some(fd));
        }
        (self.prepare)(&self.root, Need::Reach).map_err(io_err("reach the workspace"))?;
        open()
    }

    fn made_root_fd(&self) -> Result<OwnedFd, FileError> {
        if let Some(fd) = self.root_fd()? {
            return Ok(fd);
        }
        (self.prepare)(&self.root, Need::Create).map_err(io_err("create the workspace"))?;
        path::open_root(&self.root).map_err(io_err("open the workspace"))
    }

    /// Write `body` to `path` (parent dirs made), through a temporary file
    /// renamed into place when complete: a reader never sees half a file,
    /// and a failed upload leaves the old one. Creates the workspace when
    /// missing (before the session's first cell).
    ///
    /// # Errors
    /// `invalid_path`, `is_a_directory` (the target or the root),
    /// `not_a_directory`, `too_large`, `quota_exceeded`, `bad_body`, `io`.
    pub(super) async fn write<R: AsyncRead + Unpin>(
        &self,
        rel: &str,
        mut body: R,
        limits: WriteLimits,
    ) -> Result<Written, FileError> {
        let rel = RelPath::parse(rel)?;
        if rel.is_root() {
            return Err(FileError::IsADirectory {
                path: String::new(),
                hint: " (the workspace root); name a file, e.g. data/sales.csv",
            });
        }
        let me = self.clone();
        let rel2 = rel.clone();
        let (parent, tmp, file, existing, remaining) =
            blocking(move || me.begin_write(&rel2)).await?;
        let cleanup = |parent: OwnedFd, tmp: std::ffi::CString| async move {
            let _ = tokio::task::spawn_blocking(move || {
                // SAFETY: a valid dir fd and a NUL-terminated name.
                unsafe { libc::unlinkat(parent.as_raw_fd(), tmp.as_ptr(), 0) }
            })
            .await;
        };
        // The workspace's own filesystem is full (its volume is sized to
        // the quota): the quota, as the count would have said.
        let quota = self.quota;
        let full = |err: std::io::Error| match (err.raw_os_error(), quota) {
            (Some(libc::ENOSPC | libc::EDQUOT), Some(quota)) => FileError::QuotaExceeded {
                quota_mib: quota / MIB,
                used_mib: quota / MIB,
            },
            _ => FileError::Io {
                about: "write the upload",
                err,
            },
        };
        let mut file = tokio::fs::File::from_std(std::fs::File::from(file));
        let mut hasher = sha2::Sha256::new();
        let mut size: u64 = 0;
        let mut buf = vec![0u8; CHUNK];
        let copied: Result<(), FileError> = async {
            loop {
                let n = body.read(&mut buf).await.map_err(FileError::Body)?;
                if n == 0 {
                    break;
                }
                size += n as u64;
                if let Some(max) = limits.max_bytes {
                    if size > max {
                        return Err(FileError::TooLarge {
                            limit_mib: max / MIB,
                        });
                    }
                }
                if let (Some(quota), Some(left)) = (self.quota, remaining) {
                    if size > left {
                        return Err(FileError::QuotaExceeded {
                            quota_mib: quota / MIB,
                            used_mib: (quota - left) / MIB,
                        });
                    }
                }
                hasher.update(&buf[..n]);
                file.write_all(&buf[..n]).await.map_err(full)?;
            }
            file.flush().await.map_err(full)
        }
        .await;
        drop(file);
        if let Err(e) = copied {
            cleanup(parent, tmp).await;
            return Err(e);
        }
        let name = path::name(rel.split_last().map_or("", |(_, n)| n))
            .map_err(|e| path::resolve_error(&rel, e))?;
        let renamed = blocking(move || {
            path::rename_in(&parent, &tmp, &name).map_err(|err| {
                // SAFETY: a valid dir fd and a NUL-terminated name.
                unsafe { libc::unlinkat(parent.as_raw_fd(), tmp.as_ptr(), 0) };
                FileError::Io {
                    about: "move the upload into place",
                    err,
                }
            })
        })
        .await;
        renamed.map_err(|e| match e {
            FileError::Io { err, .. } if err.raw_os_error() == Some(libc::EISDIR) => {
                FileError::IsADirectory {
                    path: rel.display(),
                    hint: "; remove it first or upload to a path inside it",
                }
            }
            e => e,
        })?;
        Ok(Written {
            path: rel.display(),
            size,
            sha256: super::hex(&hasher.finalize()),
            created: !existing,
        })
    }

    /// Resolve the parent (made as needed), check the target, create the
    /// temporary file owned by the root's owner, and work out the quota
    /// left. Returns (parent fd, temp name, temp fd, a file was there, bytes
    /// left).
    #[allow(clippy::type_complexity)]
    fn begin_write(
        &self,
        rel: &RelPath,
    ) -> Result<(OwnedFd, std::ffi::CString, OwnedFd, bool, Option<u64>), FileError> {
        let root = self.made_root_fd()?;
        let st = path::fstat(root.as_raw_fd()).map_err(io_err("stat the workspace"))?;
        let owner = (st.st_uid, st.st_gid);
        let (parents, last) = rel.split_last().expect("not the root");
        let parent = path::walk_dirs(&root, parents, Some(owner))
            .map_err(|e| path::resolve_error(rel, e))?;
        let name = path::name(last).map_err(|e| path::resolve_error(rel, e))?;
        let (existing, old_size) = match path::lstat_at(parent.as_raw_fd(), &name) {
            Ok(st) if path::kind_of(&st) == Kind::Dir => {
                return Err(FileError::IsADirectory {
                    path: rel.display(),
                    hint: "; remove it first or upload to a path inside it",
                })
            }
            Ok(st) if path::kind_of(&st) == Kind::File => (true, st.st_size as u64),
            Ok(_) => (true, 0),
            Err(_) => (false, 0),
        };
        let remaining = match self.quota {
            Some(quota) => {
                let used = usage(&root).saturating_sub(old_size);
                if used >= quota {
                    return Err(FileError::QuotaExceeded {
                        quota_mib: quota / MIB,
                        used_mib: used / MIB,
                    });
                }
                Some(quota - used)
            }
            None => None,
        };
        let tmp = path::name(&format!("{UPLOAD_PREFIX}{}", crate::kernel::random_hex(8)))
            .map_err(io_err("name the upload"))?;
        let fd = path::open_at(
            parent.as_raw_fd(),
            &tmp,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )
        .map_err(|e| path::resolve_error(rel, e))?;
        if let Err(err) = path::own(&fd, owner.0, owner.1, 0o644) {
            // SAFETY: a valid dir fd and a NUL-terminated name.
            unsafe { libc::unlinkat(parent.as_raw_fd(), tmp.as_ptr(), 0) };
            return Err(FileError::Io {
                about: "set the upload's owner",
                err,
            });
        }
        Ok((parent, tmp, fd, existing, remaining))
    }

    /// Open `path` for reading: a regular file, or `Dir` for a directory.
    ///
    /// # Errors
    /// `invalid_path` (a symlink on the way, `..`, …), `not_found`,
    /// `not_a_directory`, `not_a_regular_file`.
    pub(super) async fn open(&self, rel: &str) -> Result<Opened, FileError> {
        let rel = RelPath::parse(rel)?;
        let me = self.clone();
        blocking(move || {
            let Some(root) = me.root_fd()? else {
                return if rel.is_root() {
                    Ok(Opened::Dir)
                } else {
                    Err(FileError::NotFound {
                        path: rel.display(),
                    })
                };
            };
            match path::open_read(&root, &rel)? {
                path::Opened::Dir => Ok(Opened::Dir),
                path::Opened::File(fd, st) => Ok(Opened::File(FileReader {
                    source: Source::Local(tokio::fs::File::from_std(std::fs::File::from(fd))),
                    size: st.st_size as u64,
                    modified: modified(&st),
                    etag: format!(
                        "\"{:x}-{:x}-{:x}\"",
                        st.st_ino,
                        st.st_size,
                        st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128
                    ),
                })),
            }
        })
        .await
    }

    /// Copy `path` (or its `range`, start and length) to `dst`. Returns the
    /// bytes copied.
    pub(super) async fn read_to<W: AsyncWrite + Unpin>(
        &self,
        rel: &str,
        range: Option<(u64, u64)>,
        dst: &mut W,
    ) -> Result<u64, FileError> {
        let reader = match self.open(rel).await? {
            Opened::File(f) => f,
            Opened::Dir => {
                return Err(FileError::IsADirectory {
                    path: rel.trim_matches('/').to_owned(),
                    hint: "; list it instead",
                })
            }
        };
        let (start, len) = range.unwrap_or((0, reader.size));
        let mut src = reader
            .range(start, len)
            .await
            .map_err(io_err("read a file"))?;
        tokio::io::copy(&mut src, dst)
            .await
            .map_err(io_err("copy a file"))
    }

    /// The entries of the directory at `path` (`""`: the root); with
    /// `recursive`, of every directory beneath it (never through a
    /// symlink), at most `max` entries (`truncated` then).
    ///
    /// # Errors
    /// `invalid_path`, `not_found`, `not_a_directory`.
    pub(super) async fn list(
        &self,
        rel: &str,
        recursive: bool,
        max: usize,
    ) -> Result<Listing, FileError> {
        let rel = RelPath::parse(rel)?;
        let me = self.clone();
        blocking(move || {
            let Some(root) = me.root_fd()? else {
                return if rel.is_root() {
                    Ok(Listing::default())
                } else {
                    Err(FileError::NotFound {
                        path: rel.display(),
                    })
                };
            };
            let mut listing = Listing::default();
            let mut queue = std::collections::VecDeque::from([rel.clone()]);
            while let Some(dir_path) = queue.pop_front() {
                let dir = match path::walk_dirs(&root, dir_path.parts(), None) {
                    Ok(d) => d,
                    Err(e) if dir_path == rel => return Err(path::resolve_error(&rel, e)),
                    Err(_) => continue, // swapped for a symlink or gone meanwhile
                };
                let left = max.saturating_sub(listing.entries.len());
                let (entries, more) =
                    path::read_dir(&dir, left).map_err(io_err("read a workspace directory"))?;
                let mut entries: Vec<_> = entries.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                for (name, st) in entries {
                    let kind = match path::kind_of(&st) {
                        Kind::File => EntryType::File,
                        Kind::Dir => EntryType::Dir,
                        Kind::Symlink => EntryType::Symlink,
                        Kind::Special => EntryType::Other,
                    };
                    let child = dir_path.join(&name);
                    if recursive && kind == EntryType::Dir {
                        queue.push_back(child.clone());
                    }
                    listing.entries.push(Entry {
                        name,
                        path: child.display(),
                        kind,
                        size: if kind == EntryType::Dir {
                            0
                        } else {
                            st.st_size as u64
                        },
                        modified: modified(&st),
                    });
                }
                if more || listing.entries.len() >= max && !queue.is_empty() {
                    listing.truncated = true;
                    break;
                }
            }
            Ok(listing)
        })
        .await
    }

    /// Remove the file (or symlink, itself) at `path`; a directory only
    /// when empty, or with everything in it when `recursive`.
    ///
    /// # Errors
    /// `invalid_path` (also the root itself), `not_found`,
    /// `is_a_directory` (non-empty without `recursive`).
    pub(super) async fn remove(&self, rel: &str, recursive: bool) -> Result<(), FileError> {
        let rel = RelPath::parse(rel)?;
        let Some((parents, last)) = rel.split_last() else {
            return Err(FileError::InvalidPath {
                path: String::new(),
                why:
                    "the workspace root itself is not removed; DELETE the session to drop its files"
                        .into(),
            });
        };
        let (parents, last) = (parents.to_vec(), last.to_owned());
        let me = self.clone();
        blocking(move || {
            let Some(root) = me.root_fd()? else {
                return Err(FileError::NotFound {
                    path: rel.display(),
                });
            };
            let dir =
                path::walk_dirs(&root, &parents, None).map_err(|e| path::resolve_error(&rel, e))?;
            let name = path::name(&last).map_err(|e| path::resolve_error(&rel, e))?;
            path::remove_at(&dir, &name, recursive, 0).map_err(|e| match e.raw_os_error() {
                Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => FileError::IsADirectory {
                    path: rel.display(),
                    hint: " and not empty; remove it with recursive=true",
                },
                _ => path::resolve_error(&rel, e),
            })
        })
        .await
    }

    /// Bytes of regular files in the workspace (what the quota counts).
    pub(super) async fn usage(&self) -> Result<u64, FileError> {
        let me = self.clone();
        blocking(move || Ok(me.root_fd()?.map_or(0, |root| usage(&root)))).await
    }
}

/// Sum of regular files' sizes beneath `dir`, never through a symlink.
/// Directories nested past 256 levels are not counted.
pub(crate) fn usage(dir: &OwnedFd) -> u64 {
    fn walk(dir: &OwnedFd, depth: usize) -> u64 {
        let Ok((entries, _)) = path::read_dir(dir, usize::MAX) else {
            return 0;
        };
        let mut total = 0;
        for (name, st) in entries {
            match path::kind_of(&st) {
                Kind::File => total += st.st_size as u64,
                Kind::Dir if depth < 256 => {
                    let sub = path::name(&name).and_then(|n| {
                        path::open_at(dir.as_raw_fd(), &n, libc::O_RDONLY | libc::O_DIRECTORY, 0)
                    });
                    if let Ok(sub) = sub {
                        total += walk(&sub, depth + 1);
                    }
                }
                _ => {}
            }
        }
        total
    }
    walk(dir, 0)
}
