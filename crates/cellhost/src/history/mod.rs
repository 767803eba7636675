//! Cell history: every cell a daemon ran, in SQLite, kept across restarts.
//!
//! One row per cell: who ran it (session, delegated child), the code (with
//! known token formats and the host's secret values redacted), how it
//! ended, its output as returned, timings, and which kernel ran it.
//!
//! [`History::record_committed`] returns a [`Committed`] that resolves
//! once the row's transaction has committed: the daemon answers a cell
//! only then, so a cell it acknowledged is in the history even if the
//! daemon is SIGKILLed right after (in WAL mode a commit survives the
//! process; only an OS crash can lose the last ones). The commit runs on
//! the caller's thread when no other is running, and concurrent rows share
//! one transaction (group commit, see `commit`): expect tens of µs of
//! blocking file I/O in the call. [`History::record`] queues a row for a
//! background thread that commits in batches. Reads ([`History::session`],
//! [`History::recent`]) open their own connection (WAL lets them run
//! beside the writer); call them from `spawn_blocking` in async code.
//! Retention (`[history] max_rows`, `max_days`) is applied at open and
//! every [`PRUNE_EVERY`] rows, and WAL checkpoints every few hundred
//! transactions, both on the background thread.
//!
//! Rows are bounded: each text field keeps at most `[history]
//! max_field_bytes` (head and tail, see [`cap_text`]), and
//! [`History::page`] reads at most a given number of rows *and* bytes,
//! saying where the next (older) page starts. A row that cannot be
//! committed (a full disk) is never silent: the waiter learns it, and
//! [`History::health`] counts it and says why until a later row commits.

mod cap;
mod commit;
mod store;

pub use cap::{cap_text, sha256_hex, CUT_MARKER};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use cellhost_protocol::{CellResult, DisplayItem};
use serde::{Deserialize, Serialize};

use crate::config::HistoryConfig;
use crate::output::Cleaner;

/// Rows written between two retention passes.
pub const PRUNE_EVERY: u64 = 256;

/// One recorded cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Row id, increasing in recording order.
    pub id: i64,
    /// The session (owner key) whose kernel ran it.
    pub session: String,
    /// The delegated child that ran it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<String>,
    /// The cell's source, with known token formats and the host's secret
    /// values redacted, cut to `max_field_bytes` (head and tail).
    pub code: String,
    /// `success`, `error`, `timeout` or `interrupted`.
    pub status: String,
    /// The cell's stdout as returned to the caller, cut to
    /// `max_field_bytes` (head and tail).
    pub stdout: String,
    /// The cell's stderr as returned, cut likewise.
    pub stderr: String,
    /// `repr()` of the cell's last expression, when it had one (cut
    /// likewise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The one-line error (`ZeroDivisionError: division by zero`), when
    /// the cell failed (cut likewise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Unix time (seconds) the cell was received.
    pub started_at: f64,
    /// Wall time of the cell, seconds.
    pub duration_seconds: f64,
    /// The kernel process's execution count after this cell (1 for the
    /// first cell of a process).
    pub execution_count: u64,
    /// The id (`k-…`) of the kernel process that ran it.
    pub kernel_id: String,
    /// Tool RPC calls the cell made.
    pub tool_calls_made: u64,
    /// The caller asked for a reset before this cell.
    pub state_reset: bool,
    /// The session's earlier state was lost without being asked for
    /// (timeout kill, crash, eviction).
    pub state_lost: bool,
    /// The plain sentence the result carried when state was reset, lost
    /// or the kernel ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The `[[tenants]]` tenant whose session ran it (`None`: the
    /// admin's); `session` is then the owner key `tenant:session`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The cell's rich outputs (images, HTML), at most
    /// [`DISPLAY_FIELDS`] × `max_field_bytes` of data per row: items past
    /// that are left out of the row (the cell's own result had them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub displays: Vec<DisplayItem>,
    /// Which client ran the cell, when it said (an MCP client's
    /// `clientInfo` name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

/// A row keeps up to this many times `max_field_bytes` of display data
/// (a plot is larger than a typical text field).
pub const DISPLAY_FIELDS: usize = 8;

impl HistoryEntry {
    /// The row for `result` of `code`, run by `session` (or its `child`).
    pub fn of(
        session: &str,
        child: Option<&str>,
        code: &str,
        started_at: f64,
        result: &CellResult,
    ) -> HistoryEntry {
        HistoryEntry {
            id: 0,
            session: session.to_owned(),
            child: child.map(str::to_owned),
            code: code.to_owned(),
            status: result.status.as_str().to_owned(),
            stdout: result.stdout.clone(),
            stderr: result.stderr.clone(),
            value: result.value.clone(),
            error: result.error.clone(),
            started_at,
            duration_seconds: result.duration_seconds,
            execution_count: result.kernel.execution_count,
            kernel_id: result.kernel.id.clone(),
            tool_calls_made: result.tool_calls_made,
            state_reset: result.kernel.state_reset,
            state_lost: result.kernel.state_lost,
            note: result.kernel.note.clone(),
            tenant: None,
            displays: result.displays.clone(),
            client: None,
        }
    }
}

/// Why the history database cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// A SQLite call failed: opening or migrating the database, applying
    /// retention, or a read.
    #[error("failed to {about} ({path})")]
    Sqlite {
        /// What was being done, phrased to follow "failed to ".
        about: &'static str,
        /// The database file.
        path: PathBuf,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// A filesystem step of [`History::open`] failed: creating the
    /// directory (0700) or the database file (0600), or starting the
    /// writer thread.
    #[error("failed to create the history directory {path}")]
    Dir {
        /// The directory, or the database file for the later steps.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Resolves once a row from [`History::record_committed`] has committed
/// (`true`), or could not be (`false`: the insert failed or the writer
/// has stopped; the writer's log says why).
pub struct Committed {
    rx: Option<tokio::sync::oneshot::Receiver<bool>>,
    /// This caller commits the queue, after one yield to the runtime so
    /// that the other tasks ready to answer queue their rows first and
    /// share the transaction (on one worker thread nobody could queue
    /// while the commit runs).
    lead: Option<(Arc<commit::Committer>, Yield)>,
}

type Yield = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl std::fmt::Debug for Committed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Committed")
            .field("waits", &self.rx.is_some())
            .field("leads", &self.lead.is_some())
            .finish()
    }
}

impl std::future::Future for Committed {
    type Output = bool;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<bool> {
        if let Some((c, y)) = &mut self.lead {
            std::task::ready!(y.as_mut().poll(cx));
            c.lead();
            self.lead = None;
        }
        match &mut self.rx {
            Some(rx) => std::pin::Pin::new(rx).poll(cx).map(|r| r.unwrap_or(false)),
            // `[history] wait_for_commit = false`: not waited for.
            None => std::task::Poll::Ready(true),
        }
    }
}

impl Drop for Committed {
    fn drop(&mut self) {
        // A leader dropped before it committed still commits: the rows of
        // the callers who count on it must not wait for the next one.
        if let Some((c, _)) = self.lead.take() {
            c.lead();
        }
    }
}

/// How the writes are going (`/healthz`, `/metrics`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryHealth {
    /// Rows that could not be committed since the history was opened.
    pub write_failures: u64,
    /// Why the latest write failed, while no later write has succeeded
    /// (`None`: the latest write committed).
    pub failing: Option<String>,
}

/// Shared by the writer thread and the readers of [`History::health`].
#[derive(Debug, Default)]
pub(crate) struct Health {
    failures: AtomicU64,
    failing: Mutex<Option<String>>,
}

impl Health {
    fn committed(&self) {
        let mut f = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_some() {
            *f = None;
        }
    }

    fn failed(&self, rows: usize, why: String) {
        self.failures.fetch_add(rows as u64, Ordering::Relaxed);
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }
}

/// What [`History::page`] reads.
#[derive(Debug, Clone, Default)]
pub struct PageQuery {
    /// One session's cells (its children's included); `None`: every session.
    pub session: Option<String>,
    /// Only this tenant's cells (`None`: every tenant's and the admin's).
    pub tenant: Option<String>,
    /// Most rows.
    pub limit: usize,
    /// Most bytes of text (code and output) in the page; the newest row
    /// is returned even when it alone is larger.
    pub max_bytes: usize,
    /// Only rows older than this id (the previous page's `next_before`).
    pub before: Option<i64>,
    /// Only rows newer than this id (a poller's last seen id).
    pub after: Option<i64>,
}

/// A page of history: the newest matching rows, oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// At most [`PageQuery::limit`] rows, oldest first, text fields cut
    /// to `max_field_bytes`.
    pub rows: Vec<HistoryEntry>,
    /// Older matching rows were left out: ask again with `before` = this.
    pub next_before: Option<i64>,
}

/// The history store. Cheap to share behind an `Arc`.
pub struct History {
    path: PathBuf,
    /// `[history] wait_for_commit`.
    wait_for_commit: bool,
    /// `[history] max_field_bytes`.
    max_field: usize,
    health: Arc<Health>,
    committer: Arc<commit::Committer>,
    background: Mutex<Option<JoinHandle<()>>>,
    cleaner: Cleaner,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History").field("path", &self.path).finish()
    }
}

impl History {
    /// Open (or create) the database at `path`, apply retention, and start
    /// the writer thread. `secrets` are redacted from recorded code.
    ///
    /// # Errors
    /// [`HistoryError`] when the file cannot be created or is not a
    /// history database.
    pub fn open(
        path: &Path,
        config: &HistoryConfig,
        secrets: impl IntoIterator<Item = String>,
    ) -> Result<History, HistoryError> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        // Cells' code and output are private: a new directory is 0700, the
        // database (and its -wal/-shm, which SQLite creates with the
        // database's mode) 0600.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|source| HistoryError::Dir {
                    path: dir.to_owned(),
                    source,
                })?;
        }
        let private = |p: &Path| {
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600));
        };
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|source| HistoryError::Dir {
                path: path.to_owned(),
                source,
            })?;
        // A database from an older version may be readable by others.
        private(path);
        let conn = store::open_writer(path)?;
        for suffix in ["-wal", "-shm"] {
            let mut side = path.as_os_str().to_owned();
            side.push(suffix);
            let side = PathBuf::from(side);
            if side.exists() {
                private(&side);
            }
        }
        let retention = store::Retention::from(config);
        store::prune(&conn, &retention).map_err(|source| HistoryError::Sqlite {
            about: "apply history retention",
            path: path.to_owned(),
            source,
        })?;
        let checkpointer = store::open_checkpointer(path)?;
        let health = Arc::new(Health::default());
        let (committer, mailbox) = commit::Committer::new(conn, path, health.clone());
        let c = committer.clone();
        let background = std::thread::Builder::new()
            .name("cellhost-history".into())
            .spawn(move || commit::background(&c, mailbox, &retention, &checkpointer))
            .map_err(|source| HistoryError::Dir {
                path: path.to_owned(),
                source,
            })?;
        Ok(History {
            path: path.to_owned(),
            wait_for_commit: config.wait_for_commit,
            max_field: config.max_field_bytes.max(1024),
            health,
            committer,
            background: Mutex::new(Some(background)),
            cleaner: Cleaner::new(secrets),
        })
    }

    /// Where the database is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queue a row for writing. Never blocks; rows recorded after
    /// [`History::close`] are dropped.
    pub fn record(&self, entry: HistoryEntry) {
        self.committer.record(self.prepare(entry));
    }

    /// Write a row and return a future that resolves once it has
    /// committed. Unless another caller has already claimed the next
    /// commit, the future commits on the awaiting thread, after one yield
    /// to the runtime, with whatever the others queued meanwhile; a
    /// running commit takes the rest into its next transaction (group
    /// commit). Rows recorded after [`History::close`] resolve as not
    /// committed. With `[history] wait_for_commit = false` it is
    /// [`History::record`] and resolves at once.
    pub fn record_committed(&self, entry: HistoryEntry) -> Committed {
        let row = self.prepare(entry);
        if !self.wait_for_commit {
            self.committer.record(row);
            return Committed {
                rx: None,
                lead: None,
            };
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let lead = self.committer.commit(row, tx).then(|| {
            (
                self.committer.clone(),
                Box::pin(tokio::task::yield_now()) as Yield,
            )
        });
        Committed { rx: Some(rx), lead }
    }

    /// The row as stored: code redacted, fields bounded.
    fn prepare(&self, mut entry: HistoryEntry) -> Box<HistoryEntry> {
        entry.code = self.cleaner.redact(&entry.code);
        bound(&mut entry, self.max_field);
        Box::new(entry)
    }

    /// Transactions the history has committed (or tried to) since it was
    /// opened: under load, rows share them (group commit).
    pub fn commits(&self) -> u64 {
        self.committer.transactions.load(Ordering::Relaxed)
    }

    /// Block until every row recorded so far is committed.
    pub fn flush(&self) {
        self.committer.flush();
    }

    /// Commit what is queued and stop the writer. Idempotent.
    pub fn close(&self) {
        let background = self
            .background
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.committer.close(background);
    }

    /// How the writes are going: failures so far, and why the latest
    /// failed while no later write has committed.
    pub fn health(&self) -> HistoryHealth {
        HistoryHealth {
            write_failures: self.health.failures.load(Ordering::Relaxed),
            failing: self
                .health
                .failing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }

    /// A page of history bounded by rows and bytes (see [`PageQuery`]).
    /// Blocking.
    ///
    /// # Errors
    /// [`HistoryError::Sqlite`] when the database cannot be read.
    pub fn page(&self, q: &PageQuery) -> Result<Page, HistoryError> {
        let mut page = store::page(&self.path, q)?;
        for r in &mut page.rows {
            bound(r, self.max_field);
        }
        Ok(page)
    }

    /// The last `limit` cells of `session` (its children's included),
    /// oldest first. Blocking.
    ///
    /// # Errors
    /// [`HistoryError::Sqlite`] when the database cannot be read.
    pub fn session(&self, session: &str, limit: usize) -> Result<Vec<HistoryEntry>, HistoryError> {
        let mut rows = store::query(&self.path, Some(session), limit)?;
        rows.iter_mut().for_each(|r| bound(r, self.max_field));
        Ok(rows)
    }

    /// Every `(session, child)` with at least one recorded cell. Blocking.
    ///
    /// # Errors
    /// [`HistoryError::Sqlite`] when the database cannot be read.
    pub fn owners(&self) -> Result<Vec<(String, Option<String>)>, HistoryError> {
        store::owners(&self.path)
    }

    /// The last `limit` cells of every session, oldest first. Blocking.
    ///
    /// # Errors
    /// [`HistoryError::Sqlite`] when the database cannot be read.
    pub fn recent(&self, limit: usize) -> Result<Vec<HistoryEntry>, HistoryError> {
        let mut rows = store::query(&self.path, None, limit)?;
        rows.iter_mut().for_each(|r| bound(r, self.max_field));
        Ok(rows)
    }
}

/// Cut every text field of a row to `max` bytes (head and tail).
fn bound(e: &mut HistoryEntry, max: usize) {
    if e.code.len() > max {
        e.code = cap_text(&e.code, max, true);
    }
    for t in [&mut e.stdout, &mut e.stderr] {
        if t.len() > max {
            *t = cap_text(t, max, false);
        }
    }
    for t in [&mut e.value, &mut e.error, &mut e.note]
        .into_iter()
        .flatten()
    {
        if t.len() > max {
            *t = cap_text(t, max, false);
        }
    }
    bound_displays(&mut e.displays, max.saturating_mul(DISPLAY_FIELDS));
}

/// Keep the display items that fit in `budget` bytes of data, in order
/// (a large image is left out, the small text fallbacks after it stay).
pub fn bound_displays(displays: &mut Vec<DisplayItem>, budget: usize) {
    let mut used = 0usize;
    displays.retain(|d| {
        let fits = used + d.data.len() + d.mime.len() <= budget;
        if fits {
            used += d.data.len() + d.mime.len();
        }
        fits
    });
}

impl Drop for History {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests;
