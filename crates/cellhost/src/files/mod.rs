//! Workspace I/O: the files of a session, read and written by clients.
//!
//! A [`Workspace`] is a cheap handle on one owner's workspace directory
//! (handed out by [`KernelManager::workspace`](crate::registry::KernelManager::workspace));
//! the HTTP routes, the MCP resources and the CLI all go through it, so the
//! rules live once:
//!
//! - every path is resolved beneath the root without following a symlink
//!   or `..` (`path.rs`), and only regular files are read;
//! - uploads stream into a temporary file beside the target and are
//!   renamed into place, owned by the workspace dir's owner (the kernel's
//!   uid), mode 0644 (dirs 0755), never setuid;
//! - uploads respect the workspace quota (`[limits] workspace_mib`) and
//!   the upload limit (`[files] max_upload_mib`).
//!
//! The handle is in `handle.rs`, the operations on this host in
//! `local.rs` (a remote workspace's go through `crate::remote`). Cut
//! output is spilled into the workspace too (`spill.rs`), so the next
//! cell can open it.

mod handle;
mod local;
pub mod path;
pub(crate) mod spill;

use serde::Serialize;

pub use handle::{ByteReader, FileReader, Opened, Workspace, WriteLimits};
pub(crate) use local::UPLOAD_PREFIX;
pub use local::{Need, Prepare};
pub use path::RelPath;
/// Spill files of cut output kept per workspace (older ones are removed).
pub use spill::KEEP as SPILL_KEEP;

/// Default largest listing (`?recursive=true` stops there, `truncated`).
pub const DEFAULT_MAX_ENTRIES: usize = 10_000;

/// Why a workspace operation failed. [`FileError::code`] is the API's code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// `invalid_path`: the path is malformed (absolute, `.`/`..`, NUL,
    /// over-long) or passes through a symlink, which is never followed.
    #[error("invalid path {path:?}: {why}")]
    InvalidPath {
        /// The path as the client gave it (cut to 200 characters) when it
        /// is malformed; normalized (`a/b`) when a symlink was met.
        path: String,
        /// Why it was refused, phrased to follow "invalid path …: ".
        why: String,
    },
    /// `not_found`: nothing exists at the path.
    #[error("{path:?} does not exist in the workspace; list the workspace to see its files")]
    NotFound {
        /// Relative to the workspace root (`a/b/c`).
        path: String,
    },
    /// `is_a_directory`: a file was wanted (read, upload target) but the
    /// path is a directory, or a directory to remove is not empty.
    #[error("{path:?} is a directory{hint}")]
    IsADirectory {
        /// Relative to the workspace root; empty for the root itself.
        path: String,
        /// What to do instead, appended to the message as is (starts with
        /// `;` or ` (`, or is empty).
        hint: &'static str,
    },
    /// `not_a_directory`: a parent component of the path is a file.
    #[error("a part of {path:?} is a file, not a directory; name a path inside a directory")]
    NotADirectory {
        /// Relative to the workspace root.
        path: String,
    },
    /// `not_a_regular_file`: the path is a FIFO, socket or device, which
    /// the daemon never opens for reading (a planted FIFO must not hang it).
    #[error(
        "{path:?} is not a regular file (a FIFO, socket or device); only regular files are read"
    )]
    NotRegular {
        /// Relative to the workspace root.
        path: String,
    },
    /// `quota_exceeded`: the upload would take the workspace over its
    /// quota (`[limits] workspace_mib`); nothing was written.
    #[error(
        "the workspace quota of {quota_mib} MiB would be exceeded ({used_mib} MiB used); \
         remove files from the workspace or raise [limits] workspace_mib"
    )]
    QuotaExceeded {
        /// The quota, MiB (rounded down).
        quota_mib: u64,
        /// MiB already used by the workspace (rounded down), not counting
        /// the file the upload replaces; the quota itself when the
        /// workspace's volume filled up.
        used_mib: u64,
    },
    /// `too_large`: the upload body passed `[files] max_upload_mib`; the
    /// partial file was removed.
    #[error(
        "the upload is larger than {limit_mib} MiB; raise [files] max_upload_mib to send larger files"
    )]
    TooLarge {
        /// The upload limit, MiB (rounded down).
        limit_mib: u64,
    },
    /// `bad_body`: reading the client's upload body failed (the client
    /// went away, a malformed chunked body); the partial file was removed.
    #[error("the upload body could not be read")]
    Body(#[source] std::io::Error),
    /// `io`: a filesystem call failed for another reason.
    #[error("failed to {about}")]
    Io {
        /// What was being done, phrased to follow "failed to ".
        about: &'static str,
        /// The OS error.
        #[source]
        err: std::io::Error,
    },
}

impl FileError {
    /// The stable code: `invalid_path`, `not_found`, `is_a_directory`,
    /// `not_a_directory`, `not_a_regular_file`, `quota_exceeded`,
    /// `too_large`, `bad_body`, `io`.
    pub fn code(&self) -> &'static str {
        match self {
            FileError::InvalidPath { .. } => "invalid_path",
            FileError::NotFound { .. } => "not_found",
            FileError::IsADirectory { .. } => "is_a_directory",
            FileError::NotADirectory { .. } => "not_a_directory",
            FileError::NotRegular { .. } => "not_a_regular_file",
            FileError::QuotaExceeded { .. } => "quota_exceeded",
            FileError::TooLarge { .. } => "too_large",
            FileError::Body(_) => "bad_body",
            FileError::Io { .. } => "io",
        }
    }
}

/// What a listing entry is. Symlinks are listed, never followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (its target is not read or reported).
    Symlink,
    /// A FIFO, socket or device (listed so its name is no mystery; never read).
    Other,
}

/// One listing entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// The last name.
    pub name: String,
    /// Relative to the workspace root.
    pub path: String,
    /// What it is, serialized as `type`.
    #[serde(rename = "type")]
    pub kind: EntryType,
    /// Bytes (files), 0 for directories.
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub modified: f64,
}

/// A directory's entries (with `recursive`, every level's, breadth first).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Listing {
    /// Names sorted by byte order within each directory; with
    /// `recursive`, directories breadth first.
    pub entries: Vec<Entry>,
    /// The listing stopped at its bound.
    pub truncated: bool,
}

/// What an upload wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Written {
    /// Where it was written, relative to the workspace root.
    pub path: String,
    /// Bytes written.
    pub size: u64,
    /// Hex SHA-256 of the bytes written.
    pub sha256: String,
    /// No file was there before (HTTP 201; 200 when replaced).
    #[serde(skip)]
    pub created: bool,
}

/// A Content-Type from the extension.
pub fn mime_of(path: &str) -> &'static str {
    let ext = path
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "txt" | "log" | "md" | "py" | "toml" | "yaml" | "yml" | "ini" | "cfg" => {
            "text/plain; charset=utf-8"
        }
        "csv" => "text/csv; charset=utf-8",
        "tsv" => "text/tab-separated-values; charset=utf-8",
        "json" => "application/json",
        "html" | "htm" => "text/html; charset=utf-8",
        "xml" => "application/xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        _ => "application/octet-stream",
    }
}

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
