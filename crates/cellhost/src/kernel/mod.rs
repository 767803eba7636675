//! Session kernels: one live Python process per [`Kernel`] handle.
//!
//! A [`Kernel`] is a cheap, cloneable handle. One task (the session actor,
//! in `actor.rs`) owns the kernel through a `driver::Driver`: the local
//! one (`local.rs`: the process, its pipes and its output captures) or a
//! remote one (`crate::remote::kernel`). Handles send the actor messages;
//! cells run one at a time in arrival order.
//!
//! The process side lives in `process.rs` (spawn, teardown), waiting for a
//! cell in `wait.rs`, what results say about state in `report.rs`, rich
//! outputs in `display.rs`, the control frames in `frame.rs`, Unix plumbing
//! in `crate::sys`, and the Python runner in `src/runner/` (`runner.py`, and
//! `display.py` for rich outputs).

mod actor;
mod breach;
mod display;
mod fork;
pub(crate) use fork::{Spare, STRICT as FORK_STRICT};
mod template;
pub use template::{ForkError, Template};
pub(crate) mod driver;
pub(crate) mod frame;
mod leader;
mod local;
mod process;
pub mod record;
mod report;
pub(crate) mod snapshot;
pub(crate) mod staging;
mod stream;
mod wait;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cellhost_protocol::CellResult;
use tokio::sync::{mpsc, oneshot};

use crate::env::ChildEnv;
use crate::interpreter::{Interpreter, InterpreterError};
use crate::output::OutputLimits;
use crate::sandbox::{ResourceLimits, Sandbox, SandboxError};
use crate::tools::ToolSet;
pub(crate) use process::max_display_bytes;

pub(crate) use display::Displays;
pub use display::{CellEvent, DisplayLimits};
pub(crate) use process::{Exit, RUNNER_FILES, RUNNER_SOURCE};
pub use snapshot::{SnapshotError, SnapshotLimits, Summary as SnapshotSummary};
// Old paths of the helpers now in `crate::sys`.
pub(crate) use crate::sys::random_hex;
pub use crate::sys::{pid_alive, process_group, process_start_time, rss_bytes};
pub(crate) use actor::Actor;
pub use report::{add_note, NoteAt, StateChange};
pub(crate) use report::{report as describe_outcome, transport_lost, Report, Vacancy};
pub(crate) use wait::{Outcome, Stop};

/// How to start kernels. `Default` gives a local kernel on `python3` from
/// PATH (resolved once), the host's allow-listed environment, and the
/// limits documented in docs/sandbox.md.
#[derive(Debug, Clone)]
pub struct KernelOptions {
    /// Interpreter path or bare name; `None` means `$CELLHOST_PYTHON` or
    /// `python3` on PATH. Shims are resolved to the real binary once.
    pub python: Option<PathBuf>,
    /// Working directory of the kernel (default: the host's).
    pub cwd: Option<PathBuf>,
    /// The kernel's environment and the secret values to redact.
    pub env: ChildEnv,
    /// Parent of the per-kernel 0700 staging dirs.
    pub staging_root: PathBuf,
    /// Where full output is spilled when a cell's output is cut. Spill
    /// files outlive the kernel; their owner removes them.
    pub spill_dir: PathBuf,
    /// How much of each cell's stdout and stderr a result keeps (the rest is
    /// cut in the middle and spilled; see [`OutputLimits`]).
    pub output: OutputLimits,
    /// Size caps of rich outputs (`display()`, figures).
    pub display: DisplayLimits,
    /// Timeout of cells that do not set their own (`None`: no limit).
    pub default_timeout: Option<Duration>,
    /// How long an interrupted cell may take to settle before the kernel
    /// is killed (default 2 s).
    pub interrupt_grace: Duration,
    /// SIGTERM → SIGKILL grace at teardown (default 1 s).
    pub teardown_grace: Duration,
    /// How long a new runner may take to say hello (default 30 s).
    pub spawn_timeout: Duration,
    /// Where to record live kernel processes for crash recovery (see
    /// [`record`]); `None` keeps no records.
    pub record_dir: Option<PathBuf>,
    /// Isolation profile (default [`Sandbox::None`]; the daemon uses
    /// strict). With strict, `cwd` is a path inside the sandbox (default
    /// `/workspace`).
    pub sandbox: Sandbox,
    /// Per-kernel resource limits (default [`ResourceLimits::default`],
    /// in both profiles).
    pub limits: ResourceLimits,
    /// Largest tool request or result in bytes (default 10 MB).
    pub max_tool_payload: usize,
    /// Where `%pip` installs and under which `[packages]` policy.
    pub packages: crate::packages::PackageOptions,
    /// Modules the runner imports before it says hello (`[kernel]
    /// preload`; the manager sets it for pooled kernels). A missing one is
    /// skipped with a log line.
    pub preload: Vec<String>,
    /// After `preload`, run the built-in warm-ups of the preloaded
    /// modules it knows (pandas, numpy, matplotlib.pyplot: a tiny frame,
    /// array or figure made and shown), then `gc.collect()` and
    /// `gc.freeze()`, so first-call costs are paid before the hello
    /// (`[kernel] warmup`, default on).
    pub warmup: bool,
    /// The session's workspace of a `none` kernel (the manager makes it
    /// the kernel's cwd): cut output is spilled into its
    /// `.cellhost/output`. Strict kernels spill into their sandbox
    /// workspace; with neither, into `spill_dir`.
    pub workspace_dir: Option<PathBuf>,
}

/// `$XDG_RUNTIME_DIR/cellhost`, or `<tmp>/cellhost-<uid>`.
pub fn default_runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if Path::new(&d).is_absolute() => PathBuf::from(d).join("cellhost"),
        _ => std::env::temp_dir().join(format!("cellhost-{}", nix::unistd::geteuid())),
    }
}

impl Default for KernelOptions {
    fn default() -> Self {
        let root = default_runtime_dir();
        KernelOptions {
            python: None,
            cwd: None,
            env: ChildEnv::from_host(&[]),
            staging_root: root.join("kernels"),
            spill_dir: root.join("spill"),
            output: OutputLimits::default(),
            display: DisplayLimits::default(),
            default_timeout: None,
            interrupt_grace: Duration::from_secs(2),
            teardown_grace: Duration::from_secs(1),
            spawn_timeout: Duration::from_secs(30),
            record_dir: None,
            sandbox: Sandbox::None,
            limits: ResourceLimits::default(),
            max_tool_payload: crate::tools::DEFAULT_MAX_PAYLOAD,
            packages: crate::packages::PackageOptions::default(),
            preload: Vec::new(),
            warmup: true,
            workspace_dir: None,
        }
    }
}

impl KernelOptions {
    /// Run kernels on this interpreter: a path, or a bare name looked up on
    /// PATH (see [`KernelOptions::python`](KernelOptions#structfield.python)).
    pub fn python(mut self, python: impl Into<PathBuf>) -> Self {
        self.python = Some(python.into());
        self
    }

    /// Start kernels in this directory (with the strict sandbox, a path
    /// inside the sandbox).
    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Stop cells that set no timeout of their own after `timeout` of wall
    /// time (the cell is interrupted; its result says `timeout`).
    pub fn default_timeout(mut self, timeout: Duration) -> Self {
        self.default_timeout = Some(timeout);
        self
    }

    /// How long an interrupted or timed-out cell may take to settle before
    /// the kernel is killed and its state is lost.
    pub fn interrupt_grace(mut self, grace: Duration) -> Self {
        self.interrupt_grace = grace;
        self
    }

    /// Cap rich outputs (`display()`, figures) at these sizes.
    pub fn display_limits(mut self, limits: DisplayLimits) -> Self {
        self.display = limits;
        self
    }

    /// Start kernels with this environment (and redact its secrets from
    /// their output).
    pub fn env(mut self, env: ChildEnv) -> Self {
        self.env = env;
        self
    }

    /// Isolate kernels with this profile ([`Sandbox::None`] or
    /// [`Sandbox::Strict`]).
    pub fn sandbox(mut self, sandbox: Sandbox) -> Self {
        self.sandbox = sandbox;
        self
    }

    /// Apply these per-kernel resource limits (memory, CPU per cell,
    /// processes, open files, file size).
    pub fn limits(mut self, limits: ResourceLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Put staging dirs and spill files under `dir` (tests, daemons).
    pub fn runtime_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.staging_root = dir.as_ref().join("kernels");
        self.spill_dir = dir.as_ref().join("spill");
        self
    }
}

/// One execution request.
#[derive(Debug, Clone, Default)]
pub struct Cell {
    /// The Python source to run, as one cell (statements; the last
    /// expression's value becomes [`CellResult::value`]).
    pub code: String,
    /// Overrides [`KernelOptions::default_timeout`].
    pub timeout: Option<Duration>,
    /// Discard the kernel's state (restart the process) before running.
    pub reset: bool,
    /// Where to send [`CellEvent`]s (each display as it arrives) while the
    /// cell runs. The result still carries everything.
    pub events: Option<mpsc::UnboundedSender<CellEvent>>,
    /// The tools of this kernel: the generated `tools` module has one
    /// function per tool. `None`: no `tools` module, and calls are refused.
    /// The manager always sets it from the kernel key's tool set (a cell's
    /// own is replaced: only registered tools run).
    pub tools: Option<ToolSet>,
    /// This cell's allow-list, a subset of `tools` (`None`: all of them).
    pub allow: Option<BTreeSet<String>>,
    /// Most tool calls this cell may make (default
    /// [`DEFAULT_MAX_TOOL_CALLS`](crate::tools::DEFAULT_MAX_TOOL_CALLS)).
    pub max_tool_calls: Option<u32>,
    /// The front end the cell came from, for the session's watchers
    /// ([`crate::events`]).
    pub front_end: crate::events::FrontEnd,
    /// Told the cell's execution count once a process has it (before any
    /// of its output). The manager uses it to announce the cell.
    pub started: Option<mpsc::UnboundedSender<u64>>,
    /// The caller publishes the session's `cell_finished` event itself
    /// ([`crate::events::EventBus::cell_finished`]), once it has amended
    /// the result (the daemon adds its history and restart notes); the
    /// manager still publishes it for a cell that fails without a result.
    pub caller_finishes: bool,
    /// Not shown to the session's watchers at all (a front end's own
    /// helper cell, such as Jupyter completion).
    pub hidden: bool,
}

impl Cell {
    /// A cell running `code` with no timeout of its own, no reset and no
    /// tools.
    pub fn new(code: impl Into<String>) -> Cell {
        Cell {
            code: code.into(),
            ..Cell::default()
        }
    }

    /// Stop this cell after `timeout` of wall time (overrides the kernel's
    /// default timeout).
    pub fn timeout(mut self, timeout: Duration) -> Cell {
        self.timeout = Some(timeout);
        self
    }

    /// With `true`, restart the kernel process (discarding its variables
    /// and imports) before this cell runs.
    pub fn reset(mut self, reset: bool) -> Cell {
        self.reset = reset;
        self
    }

    /// Stream this cell's events (displays, as they arrive) to `sink`. A
    /// closed receiver is ignored; the cell runs on.
    pub fn events(mut self, sink: mpsc::UnboundedSender<CellEvent>) -> Cell {
        self.events = Some(sink);
        self
    }

    /// Say which front end the cell came from (see [`Cell::front_end`](Cell#structfield.front_end)).
    pub fn front_end(mut self, front: crate::events::FrontEnd) -> Cell {
        self.front_end = front;
        self
    }

    /// Give the cell these tools (see [`Cell::tools`](Cell#structfield.tools)).
    pub fn tools(mut self, tools: ToolSet) -> Cell {
        self.tools = Some(tools);
        self
    }

    /// Allow only these tools in this cell.
    pub fn allow<I, S>(mut self, names: I) -> Cell
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.allow = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// At most `n` tool calls in this cell.
    pub fn max_tool_calls(mut self, n: u32) -> Cell {
        self.max_tool_calls = Some(n);
        self
    }
}

/// Failure to start a kernel process.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The Python interpreter could not be found or probed.
    #[error(transparent)]
    Interpreter(#[from] InterpreterError),
    /// The sandbox for the kernel could not be prepared.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// A host-side step of the start (staging dir, pipes, sockets) failed.
    #[error("failed to {about}")]
    Io {
        /// What was being done, as a verb phrase ("create the staging dir").
        about: &'static str,
        /// The operating system's error.
        #[source]
        err: std::io::Error,
    },
    /// The interpreter (or bwrap) could not be executed.
    #[error("failed to start {}", python.display())]
    Exec {
        /// The interpreter that was to run the kernel.
        python: PathBuf,
        /// Why `exec` failed.
        #[source]
        err: std::io::Error,
    },
    /// The process ended before the runner said hello.
    #[error("the kernel {exit} during startup: {stderr_tail}")]
    DiedAtStart {
        /// How it ended ("exited with status 1", "was killed by signal 9 (SIGKILL)").
        exit: String,
        /// The last 4 KiB the process wrote to stderr.
        stderr_tail: String,
    },
    /// The runner did not say hello within
    /// [`KernelOptions::spawn_timeout`](KernelOptions#structfield.spawn_timeout).
    #[error("the kernel did not start within {after:?}")]
    Timeout {
        /// The timeout that passed.
        after: Duration,
    },
    /// The interpreter is older than Python 3.8.
    #[error(
        "python {version} is too old: cellhost needs Python 3.8 or newer (pass --python PATH)"
    )]
    TooOld {
        /// The version the runner reported (dotted, such as `3.7.9`).
        version: String,
    },
    /// The runner answered, but not with a valid hello.
    #[error("kernel handshake failed: {detail}")]
    Handshake {
        /// What was wrong with the answer.
        detail: String,
    },
    /// A remote kernel could not be shipped to or reached on its host
    /// (see [`crate::remote`]).
    #[error("failed to start a remote kernel on backend {backend:?}: {detail}")]
    Remote {
        /// The backend's name (`[backends.NAME]`).
        backend: String,
        /// What failed on the transport or the host, and what to check.
        detail: String,
    },
}

/// Failure of a kernel operation. A cell that fails (exception, timeout,
/// crash) is not an error: it is a [`CellResult`] that says so.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// A kernel process was needed (the first cell, or one after a reset or
    /// a crash) and could not be started.
    #[error("failed to start a kernel")]
    Spawn(#[from] SpawnError),
    /// The kernel was shut down ([`Kernel::shutdown`]); its handle is dead.
    #[error("the kernel has been shut down; start a new one")]
    Closed,
}

impl KernelError {
    /// The remote backend a failed start was on (its message names the
    /// transport's failure and what to check), `None` for a local kernel.
    pub fn remote_backend(&self) -> Option<&str> {
        match self {
            KernelError::Spawn(SpawnError::Remote { backend, .. }) => Some(backend),
            _ => None,
        }
    }
}

pub(crate) enum Request {
    Execute(Cell, oneshot::Sender<Result<CellResult, KernelError>>),
    /// One request to the runner in a turn of its own, between cells
    /// (`actor/op.rs`): its reply, or why there is none.
    Op(
        Vec<u8>,
        std::time::Duration,
        oneshot::Sender<Result<frame::Frame, String>>,
    ),
    /// A snapshot turn between cells (`snapshot.rs`).
    Snapshot(
        snapshot::Job,
        std::time::Duration,
        oneshot::Sender<Result<snapshot::Summary, SnapshotError>>,
    ),
}

pub(crate) enum Control {
    Interrupt(oneshot::Sender<bool>),
    Shutdown(oneshot::Sender<()>),
}

/// What the actor publishes about its kernel, as one watched value:
/// observers read it without asking the actor, and always see a
/// consistent whole (pid, id and count of the same process).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The live process's pid (`None`: no process).
    pub(crate) pid: Option<u32>,
    /// Its id (`k-…`); empty when none runs.
    pub(crate) id: String,
    /// A cell is running.
    pub(crate) busy: bool,
    /// Cells the live process has run.
    pub(crate) execution_count: u64,
}

/// What observers may read without asking the actor.
#[derive(Debug, Default)]
pub(crate) struct Observed {
    pub(crate) seen: tokio::sync::watch::Sender<Seen>,
    /// A new host path for the sandbox workspace, taken at the next
    /// (re)start of the process (the manager renamed the directory).
    moved_workspace: std::sync::Mutex<Option<PathBuf>>,
    /// The package dir's host path now (see [`crate::packages`]).
    pub(crate) packages: crate::packages::DirSlot,
}

impl Observed {
    /// Change what observers see (they are woken only by a change).
    pub(crate) fn update(&self, f: impl FnOnce(&mut Seen)) {
        self.seen.send_if_modified(|seen| {
            let before = seen.clone();
            f(seen);
            *seen != before
        });
    }

    fn seen(&self) -> tokio::sync::watch::Ref<'_, Seen> {
        self.seen.borrow()
    }
}

struct Inner {
    requests: mpsc::UnboundedSender<Request>,
    control: mpsc::UnboundedSender<Control>,
    observed: Arc<Observed>,
}

/// A handle to a session kernel. Clones share the kernel; when the last
/// handle is dropped the kernel is torn down.
#[derive(Clone)]
pub struct Kernel {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel").field("pid", &self.pid()).finish()
    }
}

impl Kernel {
    /// Start a kernel process and wait until it is ready. Must be called
    /// within a tokio runtime.
    ///
    /// # Errors
    /// [`SpawnError`] when no interpreter is found or it fails to start.
    pub async fn spawn(opts: KernelOptions) -> Result<Kernel, SpawnError> {
        let requested = opts.python.clone();
        let strict = opts.sandbox.is_strict();
        let interpreter = tokio::task::spawn_blocking(move || -> Result<_, SpawnError> {
            let interpreter = Interpreter::resolve(requested.as_deref())?;
            if strict {
                // Asked once per interpreter; later spawns hit the cache.
                crate::sandbox::launch::prefixes(interpreter.path())?;
            }
            Ok(interpreter)
        })
        .await
        .map_err(|e| SpawnError::Handshake {
            detail: format!("interpreter lookup panicked: {e}"),
        })??;
        let observed = Arc::new(Observed::default());
        let driver = local::LocalDriver::new(opts, interpreter, observed.clone())?;
        actor::Actor::launch(driver, observed).await
    }

    /// A handle on an actor that serves these requests and controls and
    /// keeps `observed` up to date.
    pub(crate) fn from_actor(
        observed: Arc<Observed>,
    ) -> (
        Kernel,
        mpsc::UnboundedReceiver<Request>,
        mpsc::UnboundedReceiver<Control>,
    ) {
        let (requests, req_rx) = mpsc::unbounded_channel();
        let (control, ctl_rx) = mpsc::unbounded_channel();
        let kernel = Kernel {
            inner: Arc::new(Inner {
                requests,
                control,
                observed,
            }),
        };
        (kernel, req_rx, ctl_rx)
    }

    /// Run one cell. Cells queue and run one at a time in arrival order.
    ///
    /// # Errors
    /// [`KernelError::Spawn`] when a fresh process was needed and could not
    /// start; [`KernelError::Closed`] after shutdown.
    ///
    /// # Cancel safety
    /// Dropping the future does not cancel the cell: it still runs to
    /// completion (use [`Kernel::interrupt`]); only its result is dropped.
    pub async fn execute(&self, cell: Cell) -> Result<CellResult, KernelError> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .requests
            .send(Request::Execute(cell, tx))
            .map_err(|_| KernelError::Closed)?;
        rx.await.map_err(|_| KernelError::Closed)?
    }

    /// Write a snapshot of the kernel's namespace to `dest` (zstd, written
    /// beside it and renamed into place), between cells: queued behind
    /// the cells already sent, within `limits` (a byte count: the
    /// stream's cap before compression, with the default timeout). See
    /// docs/snapshots.md.
    ///
    /// # Errors
    /// No live kernel, a backend without snapshots, the cap, the timeout,
    /// or the runner's reason.
    pub async fn snapshot_to(
        &self,
        dest: impl Into<PathBuf>,
        limits: impl Into<SnapshotLimits>,
    ) -> Result<SnapshotSummary, SnapshotError> {
        let limits = limits.into();
        let job = snapshot::Job::Take {
            dest: dest.into(),
            max: limits.max_bytes,
        };
        self.snapshot_job(job, limits.timeout).await
    }

    /// Load the snapshot at `src` into the kernel's namespace (a fresh
    /// kernel, before its first cell). Globals that cannot be loaded are
    /// listed in the summary's `skipped`.
    ///
    /// # Errors
    /// As [`Kernel::snapshot_to`]; a corrupt, truncated or foreign
    /// snapshot is the runner's reason.
    pub async fn restore_from(
        &self,
        src: impl Into<PathBuf>,
        limits: impl Into<SnapshotLimits>,
    ) -> Result<SnapshotSummary, SnapshotError> {
        let limits = limits.into();
        let job = snapshot::Job::Restore {
            src: src.into(),
            max: limits.max_bytes,
        };
        self.snapshot_job(job, limits.timeout).await
    }

    async fn snapshot_job(
        &self,
        job: snapshot::Job,
        timeout: std::time::Duration,
    ) -> Result<SnapshotSummary, SnapshotError> {
        let closed = || SnapshotError::KernelGone("its handle was closed".into());
        let (tx, rx) = oneshot::channel();
        self.inner
            .requests
            .send(Request::Snapshot(job, timeout, tx))
            .map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?
    }

    /// Send the runner one request between cells and wait for its reply
    /// (at most `timeout`).
    pub(crate) async fn op(
        &self,
        request: Vec<u8>,
        timeout: std::time::Duration,
    ) -> Result<frame::Frame, String> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .requests
            .send(Request::Op(request, timeout, tx))
            .map_err(|_| "its handle was closed".to_owned())?;
        rx.await.map_err(|_| "its handle was closed".to_owned())?
    }

    /// Interrupt the running cell (SIGINT; killed after the grace period if
    /// it does not settle). Returns `false` when no cell was running.
    pub async fn interrupt(&self) -> Result<bool, KernelError> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .control
            .send(Control::Interrupt(tx))
            .map_err(|_| KernelError::Closed)?;
        rx.await.map_err(|_| KernelError::Closed)
    }

    /// Kill the kernel (SIGTERM, grace, SIGKILL of its process group) and
    /// wait until it is gone. A running cell ends with `state_lost`.
    /// Idempotent.
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.inner.control.send(Control::Shutdown(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// The pid of the current kernel process, if one is running: the
    /// Python runner as the host sees it (also under a sandbox, where the
    /// host's child is bwrap and the runner is its grandchild).
    pub fn pid(&self) -> Option<u32> {
        self.inner.observed.seen().pid
    }

    /// `true` while a cell is running.
    pub fn is_busy(&self) -> bool {
        self.inner.observed.seen().busy
    }

    /// The id (`k-…`) of the current kernel process; empty when none runs.
    pub fn process_id(&self) -> String {
        self.inner.observed.seen().id.clone()
    }

    /// The sandbox workspace directory was renamed to `path` (the mount of
    /// a running process follows the directory); later restarts bind it
    /// there.
    pub(crate) fn workspace_moved(&self, path: PathBuf) {
        if let Ok(mut moved) = self.inner.observed.moved_workspace.lock() {
            *moved = Some(path);
        }
    }

    /// The package dir was renamed to (or, for a kernel that had none, is
    /// now) `path`: `%pip` installs there, and later restarts see it.
    pub(crate) fn packages_moved(&self, path: PathBuf) {
        *self
            .inner
            .observed
            .packages
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(path);
    }

    /// Cells the current kernel process has run.
    pub fn execution_count(&self) -> u64 {
        self.inner.observed.seen().execution_count
    }
}
