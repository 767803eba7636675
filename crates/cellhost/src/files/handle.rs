//! The [`Workspace`] handle: write from an `AsyncRead`, read to an
//! `AsyncWrite` (or open for streaming, with ranges), list, remove.
//!
//! Path resolution and opens happen on the blocking pool (`path.rs`); the
//! bytes move through tokio files in chunks, so memory per transfer stays
//! at one chunk whatever the file's size. Operations on this host live in
//! `local.rs`.

use std::io;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWrite};

use super::local::{io_err, Local, Prepare};
use super::path::RelPath;
use super::{FileError, Listing, Written};
use crate::remote::RemoteWorkspace;

/// Limits of one upload.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteLimits {
    /// Largest upload in bytes (`[files] max_upload_mib`); `None`: no limit.
    pub max_bytes: Option<u64>,
}

/// A path opened for reading.
#[derive(Debug)]
pub enum Opened {
    /// A regular file, ready to stream.
    File(FileReader),
    /// A directory (to be listed, not read).
    Dir,
}

/// A regular file opened for reading, with what `fstat` said of it.
#[derive(Debug)]
pub struct FileReader {
    pub(super) source: Source,
    /// Bytes, as of the open.
    pub size: u64,
    /// Seconds since the epoch.
    pub modified: f64,
    /// A strong validator: inode, size and mtime.
    pub etag: String,
}

#[derive(Debug)]
pub(super) enum Source {
    Local(tokio::fs::File),
    /// Read by a second exec when the range is known; the ETag must
    /// still match then.
    Remote(Box<(RemoteWorkspace, RelPath)>),
}

/// The bytes of a file (or a range of it), streamed.
pub type ByteReader = Box<dyn AsyncRead + Send + Unpin>;

impl FileReader {
    /// Seek to `start` and hand back a reader of at most `len` bytes.
    pub async fn range(self, start: u64, len: u64) -> io::Result<ByteReader> {
        match self.source {
            Source::Local(mut file) => {
                file.seek(io::SeekFrom::Start(start)).await?;
                Ok(Box::new(file.take(len)))
            }
            Source::Remote(remote) => {
                let (ws, rel) = *remote;
                let r = ws
                    .read(&rel, start, len, Some(&self.etag))
                    .await
                    .map_err(io::Error::other)?;
                Ok(Box::new(r))
            }
        }
    }
}

/// One owner's workspace, on this host or on a remote backend: the
/// handle the HTTP routes, the MCP resources and the CLI use, whatever
/// the backend. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Workspace {
    inner: Inner,
}

#[derive(Clone, Debug)]
enum Inner {
    Local(Local),
    /// With its key as a path (what [`Workspace::root`] answers).
    Remote(RemoteWorkspace, PathBuf),
}

impl Workspace {
    pub(crate) fn new(
        root: PathBuf,
        in_kernel: PathBuf,
        quota: Option<u64>,
        prepare: Prepare,
    ) -> Workspace {
        Workspace {
            inner: Inner::Local(Local::new(root, in_kernel, quota, prepare)),
        }
    }

    /// A workspace on a remote backend (see [`crate::remote::RemoteWorkspace`]).
    pub fn remote(ws: RemoteWorkspace) -> Workspace {
        let key = PathBuf::from(ws.key());
        Workspace {
            inner: Inner::Remote(ws, key),
        }
    }

    /// The remote side's handle, when the workspace is remote.
    pub fn as_remote(&self) -> Option<&RemoteWorkspace> {
        match &self.inner {
            Inner::Remote(r, _) => Some(r),
            Inner::Local(_) => None,
        }
    }

    /// The workspace directory on this host; on a remote backend, its
    /// path beneath the remote side's `<tmpdir>/cellhost-ws-<uid>/`.
    pub fn root(&self) -> &Path {
        match &self.inner {
            Inner::Local(l) => l.root(),
            Inner::Remote(_, key) => key,
        }
    }

    /// Where the kernel sees the workspace (`/workspace` in the strict
    /// sandbox; the host path otherwise; remote: as [`root`](Self::root)).
    pub fn in_kernel(&self) -> &Path {
        match &self.inner {
            Inner::Local(l) => l.in_kernel(),
            Inner::Remote(_, key) => key,
        }
    }

    /// The quota in bytes (`None`: unlimited).
    pub fn quota(&self) -> Option<u64> {
        match &self.inner {
            Inner::Local(l) => l.quota(),
            Inner::Remote(r, _) => r.quota(),
        }
    }

    /// Write `body` to `path` (parent dirs made), through a temporary file
    /// renamed into place when complete: a reader never sees half a file,
    /// and a failed upload leaves the old one. Creates the workspace when
    /// missing (before the session's first cell).
    ///
    /// # Errors
    /// `invalid_path`, `is_a_directory` (the target or the root),
    /// `not_a_directory`, `too_large`, `quota_exceeded`, `bad_body`, `io`.
    pub async fn write<R: AsyncRead + Unpin>(
        &self,
        rel: &str,
        body: R,
        limits: WriteLimits,
    ) -> Result<Written, FileError> {
        match &self.inner {
            Inner::Local(l) => l.write(rel, body, limits).await,
            Inner::Remote(r, _) => r.write(&RelPath::parse(rel)?, body, limits.max_bytes).await,
        }
    }

    /// Open `path` for reading: a regular file, or `Dir` for a directory.
    ///
    /// # Errors
    /// `invalid_path` (a symlink on the way, `..`, …), `not_found`,
    /// `not_a_directory`, `not_a_regular_file`.
    pub async fn open(&self, rel: &str) -> Result<Opened, FileError> {
        match &self.inner {
            Inner::Local(l) => l.open(rel).await,
            Inner::Remote(r, _) => {
                let rel = RelPath::parse(rel)?;
                Ok(match r.stat(&rel).await? {
                    None => Opened::Dir,
                    Some((size, modified, etag)) => Opened::File(FileReader {
                        source: Source::Remote(Box::new((r.clone(), rel))),
                        size,
                        modified,
                        etag,
                    }),
                })
            }
        }
    }

    /// Copy `path` (or its `range`, start and length) to `dst`. Returns the
    /// bytes copied.
    pub async fn read_to<W: AsyncWrite + Unpin>(
        &self,
        rel: &str,
        range: Option<(u64, u64)>,
        dst: &mut W,
    ) -> Result<u64, FileError> {
        match &self.inner {
            Inner::Local(l) => l.read_to(rel, range, dst).await,
            Inner::Remote(r, _) => {
                let rel = RelPath::parse(rel)?;
                let (start, len) = range.unwrap_or((0, u64::MAX >> 1));
                let mut src = r.read(&rel, start, len, None).await?;
                tokio::io::copy(&mut src, dst)
                    .await
                    .map_err(io_err("copy a file"))
            }
        }
    }

    /// The entries of the directory at `path` (`""`: the root); with
    /// `recursive`, of every directory beneath it (never through a
    /// symlink), at most `max` entries (`truncated` then).
    ///
    /// # Errors
    /// `invalid_path`, `not_found`, `not_a_directory`.
    pub async fn list(&self, rel: &str, recursive: bool, max: usize) -> Result<Listing, FileError> {
        match &self.inner {
            Inner::Local(l) => l.list(rel, recursive, max).await,
            Inner::Remote(r, _) => r.list(&RelPath::parse(rel)?, recursive, max).await,
        }
    }

    /// Remove the file (or symlink, itself) at `path`; a directory only
    /// when empty, or with everything in it when `recursive`.
    ///
    /// # Errors
    /// `invalid_path` (also the root itself), `not_found`,
    /// `is_a_directory` (non-empty without `recursive`).
    pub async fn remove(&self, rel: &str, recursive: bool) -> Result<(), FileError> {
        match &self.inner {
            Inner::Local(l) => l.remove(rel, recursive).await,
            Inner::Remote(r, _) => r.remove(&RelPath::parse(rel)?, recursive).await,
        }
    }

    /// Bytes of regular files in the workspace (what the quota counts).
    pub async fn usage(&self) -> Result<u64, FileError> {
        match &self.inner {
            Inner::Local(l) => l.usage().await,
            Inner::Remote(r, _) => r.usage().await,
        }
    }
}
