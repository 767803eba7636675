//! Who commits the history's rows, and when (group commit).
//!
//! A row someone waits for ([`super::History::record_committed`]) is
//! committed on a caller's own thread: no hand-off to a writer thread and
//! back, which cost two wake-ups per cell (on this project's 2-core VMs
//! each was tens of µs). The first caller to queue a row claims the next
//! commit and yields once to the runtime, so the other tasks ready to
//! answer queue their rows meanwhile; then it commits them all in one
//! transaction, unless a burst queued [`OFFLOAD_AT`] rows or more (load):
//! then the background thread commits them, and the caller's thread
//! serves the other requests meanwhile. When a commit is already running, the running committer
//! takes every queued row into its next transaction. A committer drains the queue until
//! it is empty ([`ROUNDS`] transactions at most, then the background
//! thread takes over) and checks it once more after letting go of the
//! connection, so no queued row is left without a committer.
//!
//! The background thread (`cellhost-history`) does what must not sit on
//! an answer's path: rows nobody waits for ([`super::History::record`],
//! after lingering for more), retention, and WAL checkpoints. The writing
//! connection never checkpoints by itself (`wal_autocheckpoint = 0`); the
//! background thread copies the WAL from a connection of its own beside
//! the commits, then holds the writer only for the frames appended
//! meanwhile, so a commit waits for a checkpoint's tail, not for the whole
//! copy.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::store::{self, Retention};
use super::{Health, HistoryEntry, PRUNE_EVERY};

/// Most rows one transaction commits.
const BATCH: usize = 256;

/// Rows queued at once from which a claimed commit goes to the background
/// thread (load: many answers wait, and the runtime's worker is better
/// spent on the requests than on SQLite); below it the caller commits on
/// its own thread (one cell: no hand-off on its answer's path).
const OFFLOAD_AT: usize = 4;

/// Transactions a caller's thread commits in a row before it leaves the
/// rest of the queue to the background thread (its own answer is in the
/// first).
const ROUNDS: usize = 4;

/// Transactions between two WAL checkpoints (each writes ~5 pages, so the
/// WAL stays near SQLite's default of 1,000 pages between checkpoints).
const CHECKPOINT_EVERY: u64 = 200;

/// How long rows nobody waits for linger before the background thread
/// commits them (such rows of a SIGKILLed daemon younger than this are
/// lost). A row someone waits for commits at once.
const LINGER: Duration = Duration::from_millis(5);

/// A queued row, and who waits for its commit (`true`: committed).
type Pending = (
    Box<HistoryEntry>,
    Option<tokio::sync::oneshot::Sender<bool>>,
);

#[derive(Default)]
struct Queue {
    rows: Vec<Pending>,
    /// [`Committer::close`] has begun: rows are refused.
    closed: bool,
}

/// What the background thread is asked to do.
enum Kick {
    /// Rows nobody waits for are queued: linger, then commit.
    Linger,
    /// A caller's thread left rows queued: commit them.
    Drain,
    /// [`PRUNE_EVERY`] rows since the last retention pass.
    Prune,
    /// [`CHECKPOINT_EVERY`] transactions since the last checkpoint.
    Checkpoint,
}

/// The writing side of the history: the connection, the queue, and the
/// background thread's mailbox.
pub(super) struct Committer {
    /// `None` once closed.
    conn: Mutex<Option<Connection>>,
    queue: Mutex<Queue>,
    health: Arc<Health>,
    path: PathBuf,
    since_prune: AtomicU64,
    since_checkpoint: AtomicU64,
    /// Transactions committed (or tried) since open.
    pub(super) transactions: AtomicU64,
    /// A caller has claimed the next commit (see [`Committer::commit`]).
    claimed: AtomicBool,
    /// A [`Kick::Linger`] is on its way or lingering.
    lingering: AtomicBool,
    kick: Mutex<Option<mpsc::Sender<Kick>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Committer {
    /// The committer for `conn`, and its background thread's receiving
    /// end (pass it to [`background`]).
    pub(super) fn new(
        conn: Connection,
        path: &Path,
        health: Arc<Health>,
    ) -> (Arc<Committer>, Background) {
        let (tx, rx) = mpsc::channel();
        let c = Arc::new(Committer {
            conn: Mutex::new(Some(conn)),
            queue: Mutex::new(Queue::default()),
            health,
            path: path.to_owned(),
            since_prune: AtomicU64::new(0),
            since_checkpoint: AtomicU64::new(0),
            transactions: AtomicU64::new(0),
            claimed: AtomicBool::new(false),
            lingering: AtomicBool::new(false),
            kick: Mutex::new(Some(tx)),
        });
        (c, Background(rx))
    }

    /// Queue a row; once closed, `done` is dropped instead, which resolves
    /// its wait as not committed.
    fn push(&self, row: Box<HistoryEntry>, done: Option<tokio::sync::oneshot::Sender<bool>>) {
        let mut q = lock(&self.queue);
        if !q.closed {
            q.rows.push((row, done));
        }
    }

    /// A row someone waits for: queued. `true`: the caller has claimed
    /// the next commit and must call [`Committer::lead`] (after letting
    /// other callers queue theirs); `false`: a caller that claimed it
    /// before will commit this row too.
    pub(super) fn commit(
        &self,
        row: Box<HistoryEntry>,
        done: tokio::sync::oneshot::Sender<bool>,
    ) -> bool {
        self.push(row, Some(done));
        // AcqRel both ways: a caller that finds the claim taken pushed its
        // row before the claimer's `lead` releases the claim, so that
        // commit's batch has it.
        !self.claimed.swap(true, Ordering::AcqRel)
    }

    /// The claimed commit: release the claim, then commit what is queued
    /// unless a commit is running (which then takes it). Under load
    /// ([`OFFLOAD_AT`] rows or more queued) the background thread commits
    /// instead: the caller's thread then runs the other answers meanwhile.
    pub(super) fn lead(&self) {
        self.claimed.swap(false, Ordering::AcqRel);
        if lock(&self.queue).rows.len() >= OFFLOAD_AT && lock(&self.kick).is_some() {
            self.send(Kick::Drain);
            return;
        }
        self.commit_queued(false);
    }

    /// A row nobody waits for: queued for the background thread, which
    /// lingers for more first.
    pub(super) fn record(&self, row: Box<HistoryEntry>) {
        self.push(row, None);
        if !self.lingering.swap(true, Ordering::AcqRel) {
            self.send(Kick::Linger);
        }
    }

    /// Commit everything queued so far, waiting for a running commit.
    pub(super) fn flush(&self) {
        self.commit_queued(true);
    }

    /// Refuse new rows, stop the background thread (`background` is its
    /// handle), commit what is queued and close the connection.
    pub(super) fn close(&self, background: Option<std::thread::JoinHandle<()>>) {
        lock(&self.queue).closed = true;
        drop(lock(&self.kick).take());
        if let Some(b) = background {
            let _ = b.join();
        }
        self.commit_queued(true);
        drop(lock(&self.conn).take());
    }

    fn send(&self, k: Kick) {
        if let Some(tx) = lock(&self.kick).as_ref() {
            let _ = tx.send(k);
        }
    }

    fn take(&self) -> Vec<Pending> {
        let mut q = lock(&self.queue);
        let n = q.rows.len().min(BATCH);
        q.rows.drain(..n).collect()
    }

    /// Commit queued rows if no commit is running (`wait`: wait for it
    /// and then commit whatever is left).
    fn commit_queued(&self, wait: bool) {
        loop {
            let mut conn = if wait {
                lock(&self.conn)
            } else {
                match self.conn.try_lock() {
                    Ok(g) => g,
                    Err(TryLockError::Poisoned(p)) => p.into_inner(),
                    // The running committer checks the queue again once it
                    // lets go, so this row is not left behind.
                    Err(TryLockError::WouldBlock) => return,
                }
            };
            let mut rounds = 0;
            while rounds < ROUNDS {
                let batch = self.take();
                if batch.is_empty() {
                    break;
                }
                self.write(conn.as_mut(), batch);
                rounds += 1;
            }
            drop(conn);
            if lock(&self.queue).rows.is_empty() {
                return;
            }
            if rounds == ROUNDS && !wait {
                self.send(Kick::Drain);
                return;
            }
            // A row came in after the last batch was taken, from a caller
            // that found the connection held: commit it too.
        }
    }

    /// One transaction of `batch`; tells each waiter how it went.
    fn write(&self, conn: Option<&mut Connection>, batch: Vec<Pending>) {
        let (rows, waiters): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
        let committed = match conn {
            Some(conn) => store::insert(conn, &rows).map_err(|e| e.to_string()),
            None => Err("the history is closed".to_owned()),
        };
        match &committed {
            Ok(()) => self.health.committed(),
            Err(e) => {
                eprintln!(
                    "cellhost: failed to record {} cell(s) in the history database {}: {e}",
                    rows.len(),
                    self.path.display()
                );
                self.health.failed(rows.len(), e.clone());
            }
        }
        for w in waiters.into_iter().flatten() {
            let _ = w.send(committed.is_ok());
        }
        self.transactions.fetch_add(1, Ordering::Relaxed);
        let n = rows.len() as u64;
        if self.since_prune.fetch_add(n, Ordering::Relaxed) + n >= PRUNE_EVERY {
            self.since_prune.store(0, Ordering::Relaxed);
            self.send(Kick::Prune);
        }
        if self.since_checkpoint.fetch_add(1, Ordering::Relaxed) + 1 >= CHECKPOINT_EVERY {
            self.since_checkpoint.store(0, Ordering::Relaxed);
            self.send(Kick::Checkpoint);
        }
    }
}

/// The background thread's mailbox (see [`background`]).
pub(super) struct Background(mpsc::Receiver<Kick>);

/// The background thread: lingering rows, retention and checkpoints,
/// until the committer closes. `checkpointer` is a connection of its own.
pub(super) fn background(
    c: &Committer,
    Background(rx): Background,
    retention: &Retention,
    checkpointer: &Connection,
) {
    // When the lingering rows (nobody waits for them) are committed.
    let mut linger_until: Option<Instant> = None;
    loop {
        let k = match linger_until {
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
            Some(t) => rx.recv_timeout(t.saturating_duration_since(Instant::now())),
        };
        let k = match k {
            Ok(k) => k,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                linger_until = None;
                // Cleared before committing: a row queued during the
                // commit kicks again.
                c.lingering.store(false, Ordering::Release);
                c.commit_queued(true);
                continue;
            }
            // Closing: `Committer::close` commits what is left.
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        match k {
            Kick::Linger => {
                linger_until.get_or_insert_with(|| Instant::now() + LINGER);
            }
            Kick::Drain => c.commit_queued(true),
            Kick::Prune => {
                if let Some(conn) = lock(&c.conn).as_ref() {
                    if let Err(e) = store::prune(conn, retention) {
                        eprintln!("cellhost: failed to apply history retention: {e}");
                    }
                }
                c.commit_queued(true);
            }
            Kick::Checkpoint => {
                // The bulk of the copy beside the commits, then the frames
                // they appended meanwhile with the writer held (a few, so
                // briefly): only a WAL checkpointed to its end starts over
                // at the next commit, else it grows for as long as cells
                // keep coming.
                let bulk = store::checkpoint(checkpointer);
                let rest = match lock(&c.conn).as_ref() {
                    Some(conn) => store::checkpoint(conn),
                    None => Ok(()),
                };
                if let Err(e) = bulk.and(rest) {
                    eprintln!(
                        "cellhost: failed to checkpoint the history database {}: {e}",
                        c.path.display()
                    );
                }
                c.commit_queued(true);
            }
        }
    }
}
