//! The local driver: a kernel process on this host.
//!
//! It spawns the runner (in its sandbox), keeps reading the process's
//! stdout, stderr and display frames between cells (output and displays
//! of leftover threads go to the next cell), enforces timeouts (SIGINT,
//! grace, kill) and notices a process that died or broke its control
//! channel while idle. The session actor (`actor.rs`) decides the rest.
//!
//! Waiting for one cell lives in `wait.rs`.

use std::convert::Infallible;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use cellhost_protocol::{CellResult, KernelInfo, Truncated};
use tokio::sync::mpsc;

use super::display::{CellEvent, Displays};
use super::driver::{CellRun, Driver, LiveKernel, Ran, Settled, Start};
use super::process::{Exit, Process, Rpc};
use super::record::KernelRecord;
use super::report::{Report, StateChange, Vacancy};
use super::wait::{drain, pump, take_frames, wait_for_cell, Frames, Outcome, Streams};
use super::{KernelOptions, Observed, SpawnError};
use crate::interpreter::Interpreter;
use crate::output::{finish, Capture, Cleaner};
use crate::sandbox::{launch::ensure_workspace, Sandbox};
use crate::sys::private_dir;
use crate::tools::{self, AuthoritySlot};

/// Bytes read from a pipe at a time.
const READ_CHUNK: usize = 64 * 1024;

/// How long a kernel sits idle before its cgroup counters are re-read.
const COUNTER_REFRESH_IDLE: std::time::Duration = std::time::Duration::from_millis(5);

pub(crate) struct LocalDriver {
    opts: KernelOptions,
    python: PathBuf,
    cleaner: Cleaner,
    streams: Streams,
    observed: Arc<Observed>,
    spill_seq: u64,
    spill_tag: String,
    /// The cgroup counters (OOM kills, refused forks) may have moved
    /// since last read: refreshed once the kernel sits idle, so a child
    /// OOM-killed in one cell is never blamed for a later SIGKILL.
    counters_stale: bool,
    /// The strict sandbox's workspace, shared by every process of this
    /// handle; `owned`: we made it, so it goes at shutdown.
    workspace: Option<PathBuf>,
    owned_workspace: bool,
    /// The tool token and the running cell's authority.
    rpc: Rpc,
    buf: Vec<u8>,
}

impl LiveKernel for Process {
    fn id(&self) -> &str {
        &self.id
    }
    fn pid(&self) -> u32 {
        self.pid
    }
    fn count(&mut self) -> &mut u64 {
        &mut self.execution_count
    }
    fn tools_installed(&mut self) -> &mut Option<tools::ToolSet> {
        &mut self.tools_installed
    }
    fn tools_unavailable(&self) -> Option<&str> {
        self.tools_unavailable.as_deref()
    }
}

impl LocalDriver {
    /// Make the workspace, the tool token and the captures; the process
    /// is started by the actor ([`Driver::start`]).
    pub(crate) fn new(
        opts: KernelOptions,
        interpreter: Interpreter,
        observed: Arc<Observed>,
    ) -> Result<LocalDriver, SpawnError> {
        let python = interpreter.path().to_path_buf();
        let (workspace, owned_workspace) = match &opts.sandbox {
            Sandbox::None => (None, false),
            // A template's is a tmpfs of its sandbox's own.
            Sandbox::Strict(strict) if strict.template.0 => (None, false),
            Sandbox::Strict(strict) => {
                let (dir, owned) = match &strict.workspace {
                    Some(dir) => (dir.clone(), false),
                    None => (
                        opts.staging_root
                            .join(format!("ws-{}", crate::sys::random_hex(6))),
                        true,
                    ),
                };
                if owned {
                    private_dir(&opts.staging_root).map_err(|err| SpawnError::Io {
                        about: "create the staging root",
                        err,
                    })?;
                }
                ensure_workspace(&dir, strict)?;
                (Some(dir), owned)
            }
        };
        let rpc = Rpc {
            token: crate::sys::random_hex(16).into(),
            slot: tools::AuthoritySlot::default(),
            packages: installer(&opts, &python, workspace.as_deref(), &observed),
        };
        // The tool token is a secret like the env's: never in output.
        let cleaner = Cleaner::new(
            opts.env
                .secrets
                .iter()
                .cloned()
                .chain([rpc.token.to_string()]),
        );
        let mut driver = LocalDriver {
            streams: Streams {
                out: Capture::new(&opts.output, PathBuf::new()),
                err: Capture::new(&opts.output, PathBuf::new()),
                out_eof: false,
                err_eof: false,
                ctrl_eof: false,
                displays: Displays::new(opts.display.clone(), cleaner.clone()),
            },
            opts,
            python,
            cleaner,
            observed,
            spill_seq: 0,
            spill_tag: format!("raw-{}", crate::sys::random_hex(6)),
            counters_stale: false,
            workspace,
            owned_workspace,
            rpc,
            buf: vec![0; READ_CHUNK],
        };
        private_dir(&driver.opts.spill_dir).map_err(|err| SpawnError::Io {
            about: "create the spill dir",
            err,
        })?;
        // The placeholders above become real captures for the first cell.
        let _ = driver.fresh_captures();
        Ok(driver)
    }

    /// The tool token and authority slot its processes serve.
    pub(crate) fn rpc(&self) -> &Rpc {
        &self.rpc
    }

    /// The strict sandbox's workspace on the host.
    pub(crate) fn workspace(&self) -> Option<&Path> {
        self.workspace.as_deref()
    }

    /// New captures for the next cell, returning the finished cell's. Their
    /// raw spill files (used only when a stream overflows) are named after
    /// this driver and a sequence number, so kernels sharing a spill dir
    /// never collide.
    fn fresh_captures(&mut self) -> (Capture, Capture) {
        self.spill_seq += 1;
        let name = |stream: &str| {
            self.opts.spill_dir.join(format!(
                "{}-{}.{stream}.raw",
                self.spill_tag, self.spill_seq
            ))
        };
        let out = Capture::new(&self.opts.output, name("stdout"));
        let err = Capture::new(&self.opts.output, name("stderr"));
        (
            std::mem::replace(&mut self.streams.out, out),
            std::mem::replace(&mut self.streams.err, err),
        )
    }
}

/// Between cells: keep the pipes drained and notice a death. Returns why
/// the process must go, if it must: the actor vacates outside its
/// `select!`, so a request arriving meanwhile can never cut a teardown
/// short.
async fn idle_io(proc: &mut Process, s: &mut Streams, buf: &mut [u8]) -> Option<Vacancy> {
    tokio::select! {
        r = proc.stdout.readable(), if !s.out_eof => {
            if r.is_err() || pump(&proc.stdout, buf, &mut s.out) { s.out_eof = true; }
            None
        }
        r = proc.stderr.readable(), if !s.err_eof => {
            if r.is_err() || pump(&proc.stderr, buf, &mut s.err) { s.err_eof = true; }
            None
        }
        r = proc.ctrl_rx.readable(), if !s.ctrl_eof => {
            // Between cells the runner sends only displays (from
            // threads; they go to the next cell). Anything else means
            // the channel can no longer be trusted to find the next
            // reply: the kernel is killed, and the next cell says so.
            // EOF means it is going away.
            if r.is_err() {
                s.ctrl_eof = true;
                return None;
            }
            let mut broken = None;
            for _ in 0..16 {
                match proc.ctrl_rx.try_read(buf) {
                    Ok(0) => s.ctrl_eof = true,
                    Ok(n) => {
                        proc.frames.extend(&buf[..n]);
                        match take_frames(proc, &mut s.displays) {
                            Frames::Pending => continue,
                            Frames::Done(_) => broken = Some("a reply nobody asked for".to_owned()),
                            Frames::Sync => broken = Some("a sync outside a cell".to_owned()),
                            Frames::Broken(detail) => broken = Some(detail),
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => s.ctrl_eof = true,
                }
                break;
            }
            broken.map(|detail| Vacancy::Untold(StateChange::BrokeIdle { detail }))
        }
        status = proc.child.wait() => {
            let exit = status.map_or(Exit::Unknown, Exit::from_status).unwrapped(proc.wrapped);
            proc.exited = Some(exit);
            Some(Vacancy::Untold(StateChange::DiedIdle { how: exit.describe() }))
        }
    }
}

impl Driver for LocalDriver {
    type Live = Process;
    type Fallback = Infallible;
    type Output = ();

    fn backend(&self) -> String {
        "local".into()
    }

    fn options(&self) -> &KernelOptions {
        &self.opts
    }

    fn authority_slot(&self) -> Option<&AuthoritySlot> {
        Some(&self.rpc.slot)
    }

    fn displays(&mut self) -> &mut Displays {
        &mut self.streams.displays
    }

    fn orders_displays(&self) -> bool {
        true
    }

    fn fifo_dir(&self, proc: &Process) -> Option<(PathBuf, PathBuf)> {
        let host = proc.staging().to_path_buf();
        let inside = if self.opts.sandbox.is_strict() {
            PathBuf::from(crate::sandbox::STAGING_IN_SANDBOX)
        } else {
            host.clone()
        };
        Some((host, inside))
    }

    async fn start(&mut self) -> Result<Start<Process, Infallible>, SpawnError> {
        if let Some(moved) = self
            .observed
            .moved_workspace
            .lock()
            .ok()
            .and_then(|mut m| m.take())
        {
            if self.opts.sandbox.is_strict() {
                self.workspace = Some(moved);
            } else {
                // A `none` kernel's workspace is its cwd.
                self.opts.cwd = Some(moved.clone());
                self.opts.workspace_dir = Some(moved);
            }
        }
        let p = Process::spawn(
            &self.opts,
            &self.python,
            self.workspace.as_deref(),
            &self.rpc,
        )
        .await?;
        self.streams.out_eof = false;
        self.streams.err_eof = false;
        self.streams.ctrl_eof = false;
        Ok(Start::Live(p))
    }

    /// Record the process for crash recovery.
    fn adopted(&mut self, proc: &Process) {
        if let Some(dir) = &self.opts.record_dir {
            if let Some(record) = KernelRecord::of(proc) {
                let _ = record.write(dir);
            }
        }
    }

    async fn stop(&mut self, proc: Process) {
        let id = proc.id.clone();
        proc.terminate(self.opts.teardown_grace).await;
        if let Some(dir) = &self.opts.record_dir {
            KernelRecord::remove(dir, &id);
        }
    }

    async fn idle(&mut self, proc: &mut Process) -> Option<Vacancy> {
        tokio::select! {
            biased;
            why = idle_io(proc, &mut self.streams, &mut self.buf) => why,
            // After the idle I/O: a cell arriving at once goes first,
            // and the ~85 µs read is paid only when nothing waits.
            () = tokio::time::sleep(COUNTER_REFRESH_IDLE), if self.counters_stale => {
                self.counters_stale = false;
                if let Some(cg) = &proc.cgroup {
                    proc.counters = (cg.oom_kills(), cg.pids_max_hits());
                }
                None
            }
        }
    }

    fn begin(&mut self, sink: Option<mpsc::UnboundedSender<CellEvent>>) {
        if let Some(sink) = &sink {
            super::stream::tap(&mut self.streams, sink, &self.cleaner, &self.opts.output);
        }
        self.streams.displays.begin(sink);
    }

    fn abandon_cell(&mut self) {
        self.streams.out.untap();
        self.streams.err.untap();
        self.streams.displays.abandon();
    }

    async fn run(&mut self, proc: &mut Process, cell: CellRun<'_>) -> Ran<()> {
        // A process that died since idle I/O last looked is found when
        // the cell cannot be delivered, without a wait4() per cell.
        let waited = wait_for_cell(
            proc,
            &mut self.streams,
            &mut self.buf,
            &cell.request,
            cell.timeout,
            self.opts.interrupt_grace,
            cell.control,
        )
        .await;
        self.counters_stale = true;
        match waited {
            // It died between cells and we only noticed on sending: the
            // cell never ran.
            (Outcome::NotDelivered(exit), _) => Ran::NotDelivered {
                vacancy: Vacancy::Untold(StateChange::DiedIdle {
                    how: exit.describe(),
                }),
                again: Outcome::NotDelivered(exit),
            },
            (outcome, stop) => Ran::Done(outcome, stop, ()),
        }
    }

    async fn settle(&mut self, proc: &mut Process, outcome: &Outcome, (): &mut ()) -> Settled {
        // Collect what is already in the pipes; after sys.exit() let the
        // process finish exiting (atexit handlers) first.
        match outcome {
            Outcome::Reply(frame) => {
                if frame.text("status").as_deref() == Some("exit") {
                    let _ = tokio::time::timeout(self.opts.teardown_grace, proc.child.wait()).await;
                }
                drain(proc, &mut self.streams, &mut self.buf);
            }
            Outcome::Died(_) | Outcome::NotDelivered(_) | Outcome::KilledAfterGrace => {
                drain(proc, &mut self.streams, &mut self.buf)
            }
            Outcome::Broken(_) | Outcome::ShutDown(_) => {}
        }
        let stderr_tail = match outcome {
            Outcome::Died(_) | Outcome::NotDelivered(_) => {
                self.streams.err.tail_text(400, &self.cleaner)
            }
            _ => String::new(),
        };
        Settled {
            stderr_tail,
            breach: super::breach::find(outcome, proc),
        }
    }

    /// Turn the captures and the report into the cleaned, bounded result.
    async fn finish(
        &mut self,
        report: Report,
        info: KernelInfo,
        started: Instant,
        (): (),
    ) -> CellResult {
        let [value, error, traceback, hint] = finish::clean_fields(
            &self.opts.output,
            &self.cleaner,
            [report.value, report.error, report.traceback, report.hint],
        );
        // Output that arrives from now on belongs to the next cell.
        let (mut out, mut err) = self.fresh_captures();
        let workspace = self.spill_workspace();
        let n = info.execution_count;
        // Only a cut stream's marker names its spill (formatting both
        // hints for every cell showed in the daemon's profile).
        if let Some((_, inside)) = &workspace {
            for (c, stream) in [(&mut out, "stdout"), (&mut err, "stderr")] {
                if c.is_cut() {
                    c.spill_hint(finish::spill_hint(inside, n, stream));
                }
            }
        }
        let out = out.finish(&self.cleaner);
        let err = err.finish(&self.cleaner);
        let (full_out, full_err) = (out.full.as_deref(), err.full.as_deref());
        let spill_path = match &workspace {
            Some((host, inside)) => finish::spill_to_workspace(host, inside, n, full_out, full_err),
            None => finish::write_spill(&self.opts.spill_dir, &info, full_out, full_err),
        };
        let value_display = self.streams.displays.value_display();
        let (displays, displays_dropped, displays_note) = self.streams.displays.finish();
        CellResult {
            status: report.status,
            stdout: out.text,
            stderr: err.text,
            value,
            error,
            traceback,
            hint,
            displays,
            value_display,
            truncated: Truncated {
                stdout: out.truncated,
                stderr: err.truncated,
                spill_path,
                displays_dropped,
                displays_note,
            },
            tool_calls_made: 0,
            duration_seconds: started.elapsed().as_secs_f64(),
            kernel: info,
        }
    }

    async fn fallback(
        &mut self,
        never: Infallible,
        _: &str,
        _: Option<std::time::Duration>,
        _: KernelInfo,
        _: Instant,
    ) -> (CellResult, Vacancy) {
        match never {}
    }

    fn park(&mut self, never: Infallible) -> Vacancy {
        match never {}
    }

    async fn teardown(&mut self) {
        remove_owned(self.workspace.as_deref(), self.owned_workspace);
    }
}

impl LocalDriver {
    /// Where cut output goes: the workspace on the host and where the
    /// kernel sees it (`/workspace` when strict).
    fn spill_workspace(&self) -> Option<(PathBuf, PathBuf)> {
        if self.opts.sandbox.is_strict() {
            let host = self.workspace.clone()?;
            Some((host, PathBuf::from(crate::sandbox::WORKSPACE_IN_SANDBOX)))
        } else {
            // A pooled kernel's workspace, moved to its owner's: the move
            // is taken up at its next start, and is where it is now.
            let moved = self
                .observed
                .moved_workspace
                .lock()
                .ok()
                .and_then(|m| m.clone());
            let host = moved.or_else(|| self.opts.workspace_dir.clone())?;
            Some((host.clone(), host))
        }
    }
}

impl Drop for LocalDriver {
    /// A runtime shut down with the kernel alive never runs `teardown`:
    /// the workspace this handle made still goes.
    fn drop(&mut self) {
        remove_owned(self.workspace.as_deref(), self.owned_workspace);
    }
}

/// Remove a workspace this handle made (never a caller's), and the
/// package dir beside it.
fn remove_owned(workspace: Option<&Path>, owned: bool) {
    if let (Some(dir), true) = (workspace, owned) {
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_dir_all(crate::packages::dir_for_workspace(dir));
    }
}

/// What serves this handle's `%pip`: its package dir (given, or beside
/// the strict workspace), published in `observed` so a move reaches it.
fn installer(
    opts: &KernelOptions,
    python: &Path,
    workspace: Option<&Path>,
    observed: &Observed,
) -> Option<Arc<crate::packages::Installer>> {
    let p = &opts.packages;
    let dir = p
        .dir
        .clone()
        .or_else(|| workspace.map(crate::packages::dir_for_workspace));
    *observed.packages.lock().unwrap_or_else(|e| e.into_inner()) = dir;
    let (uid, gid) = match &opts.sandbox {
        Sandbox::Strict(s) => (s.uid, s.gid),
        Sandbox::None => {
            let d = crate::sandbox::StrictSandbox::default();
            (d.uid, d.gid)
        }
    };
    let cache = p.cache_dir.clone().unwrap_or_else(|| {
        opts.staging_root
            .parent()
            .unwrap_or(&opts.staging_root)
            .join("pip-cache")
    });
    Some(Arc::new(crate::packages::Installer {
        dir: observed.packages.clone(),
        python: python.to_path_buf(),
        strict: opts.sandbox.is_strict(),
        uid,
        gid,
        policy: p.policy.clone(),
        cache,
        busy: tokio::sync::Mutex::new(()),
    }))
}
