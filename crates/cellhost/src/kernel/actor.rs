//! The kernel actor: the one task that owns a kernel process.
//!
//! It runs cells one at a time, keeps reading the process's stdout, stderr
//! and display frames between cells (output and displays of leftover
//! threads go to the next cell), enforces timeouts (SIGINT, grace, kill), notices a process
//! that died while idle, and respawns lazily on the next cell, saying in
//! the result why the state is gone.
//!
//! Waiting for one cell lives in `wait.rs`; what the result says about
//! the kernel's state is decided in `report.rs`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use cellhost_protocol::{CellResult, KernelInfo, Truncated};
use tokio::sync::mpsc;

use super::display::Displays;
use super::frame::Frame;
use super::process::{Exit, Process, Rpc};
use super::record::KernelRecord;
use super::report::{self, Report, StateChange, Vacancy};
use super::wait::{drain, pump, take_frames, wait_for_cell, Frames, Outcome, Streams};
use super::{Cell, Control, KernelError, KernelOptions, Observed, Request, SpawnError};
use crate::interpreter::Interpreter;
use crate::output::{finish, Capture, Cleaner};
use crate::sandbox::{launch::ensure_workspace, Sandbox};
use crate::sys::private_dir;
use crate::tools::{self, Authority, DEFAULT_MAX_TOOL_CALLS};

/// Bytes read from a pipe at a time.
const READ_CHUNK: usize = 64 * 1024;

/// The kernel process, or why there is none.
enum Slot {
    Live(Box<Process>),
    Vacant(Vacancy),
}

pub(crate) struct Actor {
    opts: KernelOptions,
    python: PathBuf,
    cleaner: Cleaner,
    slot: Slot,
    streams: Streams,
    observed: Arc<Observed>,
    spill_seq: u64,
    spill_tag: String,
    /// The next cell is the first one of this kernel handle.
    first: bool,
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

/// How long a kernel sits idle before its cgroup counters are re-read.
const COUNTER_REFRESH_IDLE: std::time::Duration = std::time::Duration::from_millis(5);

impl Actor {
    pub(crate) async fn start(
        opts: KernelOptions,
        interpreter: Interpreter,
        observed: Arc<Observed>,
    ) -> Result<Actor, SpawnError> {
        let python = interpreter.path().to_path_buf();
        let (workspace, owned_workspace) = match &opts.sandbox {
            Sandbox::None => (None, false),
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
        let proc = match Process::spawn(&opts, &python, workspace.as_deref(), &rpc).await {
            Ok(p) => p,
            Err(e) => {
                remove_owned(workspace.as_deref(), owned_workspace);
                return Err(e);
            }
        };
        // The tool token is a secret like the env's: never in output.
        let cleaner = Cleaner::new(
            opts.env
                .secrets
                .iter()
                .cloned()
                .chain([rpc.token.to_string()]),
        );
        private_dir(&opts.spill_dir).map_err(|err| SpawnError::Io {
            about: "create the spill dir",
            err,
        })?;
        let mut actor = Actor {
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
            slot: Slot::Vacant(Vacancy::Quiet),
            observed,
            spill_seq: 0,
            spill_tag: format!("raw-{}", crate::sys::random_hex(6)),
            first: true,
            counters_stale: false,
            workspace,
            owned_workspace,
            rpc,
            buf: vec![0; READ_CHUNK],
        };
        actor.adopt(proc);
        // The placeholders above become real captures for the first cell.
        let _ = actor.fresh_captures();
        Ok(actor)
    }

    /// New captures for the next cell, returning the finished cell's. Their
    /// raw spill files (used only when a stream overflows) are named after
    /// this actor and a sequence number, so kernels sharing a spill dir
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

    pub(crate) async fn run(
        mut self,
        mut requests: mpsc::UnboundedReceiver<Request>,
        mut control: mpsc::UnboundedReceiver<Control>,
    ) {
        loop {
            tokio::select! {
                biased;
                ctl = control.recv() => match ctl {
                    Some(Control::Interrupt(tx)) => { let _ = tx.send(false); }
                    Some(Control::Shutdown(tx)) => {
                        self.teardown().await;
                        let _ = tx.send(());
                        return;
                    }
                    None => { self.teardown().await; return; }
                },
                req = requests.recv() => match req {
                    Some(Request::Execute(cell, tx)) => {
                        self.observed.busy.store(true, Ordering::Relaxed);
                        let (result, shutdown) = self.execute(cell, &mut control).await;
                        self.counters_stale = true;
                        self.observed.busy.store(false, Ordering::Relaxed);
                        let _ = tx.send(result);
                        if let Some(done) = shutdown {
                            self.teardown().await;
                            let _ = done.send(());
                            return;
                        }
                    }
                    None => { self.teardown().await; return; }
                },
                why = self.idle_io() => {
                    if let Some(why) = why {
                        self.vacate(why).await;
                    }
                }
                // After the idle I/O: a cell arriving at once goes first,
                // and the ~85 µs read is paid only when nothing waits.
                () = tokio::time::sleep(COUNTER_REFRESH_IDLE), if self.counters_stale => {
                    self.refresh_counters();
                }
            }
        }
    }

    /// Between cells: keep the pipes drained and notice a death.
    fn refresh_counters(&mut self) {
        self.counters_stale = false;
        if let Slot::Live(proc) = &mut self.slot {
            if let Some(cg) = &proc.cgroup {
                proc.counters = (cg.oom_kills(), cg.pids_max_hits());
            }
        }
    }

    /// Returns why the process must go, if it must: the caller vacates
    /// outside the `select!`, so a request arriving meanwhile can never
    /// cut a teardown short.
    async fn idle_io(&mut self) -> Option<Vacancy> {
        let Slot::Live(proc) = &mut self.slot else {
            return std::future::pending().await;
        };
        let s = &mut self.streams;
        tokio::select! {
            r = proc.stdout.readable(), if !s.out_eof => {
                if r.is_err() || pump(&proc.stdout, &mut self.buf, &mut s.out) { s.out_eof = true; }
                None
            }
            r = proc.stderr.readable(), if !s.err_eof => {
                if r.is_err() || pump(&proc.stderr, &mut self.buf, &mut s.err) { s.err_eof = true; }
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
                    match proc.ctrl_rx.try_read(&mut self.buf) {
                        Ok(0) => s.ctrl_eof = true,
                        Ok(n) => {
                            proc.frames.extend(&self.buf[..n]);
                            match take_frames(proc, &mut s.displays) {
                                Frames::Pending => continue,
                                Frames::Done(_) => broken = Some("a reply nobody asked for".to_owned()),
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
                let exit = status.map(Exit::from_status).unwrap_or(Exit::Unknown).unwrapped(proc.wrapped);
                proc.exited = Some(exit);
                Some(Vacancy::Untold(StateChange::DiedIdle { how: exit.describe() }))
            }
        }
    }

    async fn teardown(&mut self) {
        self.vacate(Vacancy::Quiet).await;
        remove_owned(self.workspace.as_deref(), self.owned_workspace);
    }

    /// Make `proc` the live process: publish it to observers and record it
    /// for crash recovery.
    fn adopt(&mut self, proc: Process) {
        self.observed.pid.store(proc.pid, Ordering::Relaxed);
        self.observed.execution_count.store(0, Ordering::Relaxed);
        if let Ok(mut id) = self.observed.id.lock() {
            id.clone_from(&proc.id);
        }
        if let Some(dir) = &self.opts.record_dir {
            if let Some(record) = KernelRecord::of(&proc) {
                let _ = record.write(dir);
            }
        }
        self.slot = Slot::Live(Box::new(proc));
    }

    /// Kill the live process (if any) and record why.
    async fn vacate(&mut self, why: Vacancy) {
        if let Slot::Live(proc) = std::mem::replace(&mut self.slot, Slot::Vacant(why)) {
            let id = proc.id.clone();
            proc.terminate(self.opts.teardown_grace).await;
            if let Some(dir) = &self.opts.record_dir {
                KernelRecord::remove(dir, &id);
            }
        }
        self.observed.pid.store(0, Ordering::Relaxed);
        if let Ok(mut id) = self.observed.id.lock() {
            id.clear();
        }
    }

    async fn execute(
        &mut self,
        mut cell: Cell,
        control: &mut mpsc::UnboundedReceiver<Control>,
    ) -> (
        Result<CellResult, KernelError>,
        Option<tokio::sync::oneshot::Sender<()>>,
    ) {
        let started = Instant::now();
        let mut info = KernelInfo {
            backend: "local".into(),
            reused: !self.first,
            ..KernelInfo::default()
        };
        self.first = false;
        if cell.reset {
            self.vacate(Vacancy::Untold(StateChange::Reset)).await;
        }
        // A process that died since idle I/O last looked is found when the
        // cell cannot be delivered (below), without a wait4() per cell.
        let timeout = cell.timeout.or(self.opts.default_timeout);
        let sink = cell.events.take();
        if let Some(sink) = &sink {
            super::stream::tap(&mut self.streams, sink, &self.cleaner, &self.opts.output);
        }
        self.streams.displays.begin(sink);
        // A fresh authority for every cell (one without tools refuses
        // calls with a reason), retired the moment it settles.
        let tool_set = cell.tools.take();
        let authority = tools::authority::install(
            &self.rpc.slot,
            Authority::new(
                tool_set.clone(),
                cell.allow.take(),
                cell.max_tool_calls.unwrap_or(DEFAULT_MAX_TOOL_CALLS),
            ),
        );
        let code = cell.code.into_bytes();
        let mut delivered_once = false;
        let (outcome, stop) = loop {
            if let Slot::Vacant(why) = &self.slot {
                why.describe_fresh(&mut info);
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
                match Process::spawn(
                    &self.opts,
                    &self.python,
                    self.workspace.as_deref(),
                    &self.rpc,
                )
                .await
                {
                    Ok(p) => {
                        self.adopt(p);
                        self.streams.out_eof = false;
                        self.streams.err_eof = false;
                        self.streams.ctrl_eof = false;
                    }
                    Err(e) => {
                        // The cell never ran: nothing may keep its event
                        // sink open (a caller reading events would wait
                        // forever).
                        self.streams.out.untap();
                        self.streams.err.untap();
                        self.streams.displays.abandon();
                        return (Err(e.into()), None);
                    }
                }
            }
            let Slot::Live(proc) = &mut self.slot else {
                unreachable!("a live process was just ensured")
            };
            proc.execution_count += 1;
            info.id = proc.id.clone();
            info.pid = Some(proc.pid);
            info.execution_count = proc.execution_count;
            self.observed
                .execution_count
                .store(proc.execution_count, Ordering::Relaxed);
            let mut request = Frame::new().with("op", "exec").with("code", &code[..]);
            if let Some(set) = &tool_set {
                // The process's `tools` module, sent once per tool set.
                if !proc.tools_installed.as_ref().is_some_and(|t| t.same(set)) {
                    request = request
                        .with("tools", set.module_source().as_bytes())
                        .with("tools_max", self.opts.max_tool_payload.to_string());
                    if let Some(why) = &proc.tools_unavailable {
                        request = request.with("tools_error", why.as_bytes());
                    }
                    proc.tools_installed = Some(set.clone());
                }
            }
            let request = request.encode();
            let waited = wait_for_cell(
                proc,
                &mut self.streams,
                &mut self.buf,
                &request,
                timeout,
                self.opts.interrupt_grace,
                control,
            )
            .await;
            match waited {
                // It died between cells and we only noticed on sending: the
                // cell never ran, so run it in a fresh kernel (once).
                (Outcome::NotDelivered(exit), _) if !delivered_once => {
                    delivered_once = true;
                    self.vacate(Vacancy::Untold(StateChange::DiedIdle {
                        how: exit.describe(),
                    }))
                    .await;
                }
                other => break other,
            }
        };
        // Settled: calls from now on (leftover threads) are refused, and
        // calls still in flight are cancelled.
        let tool_calls_made = authority.settle();
        let Slot::Live(proc) = &mut self.slot else {
            unreachable!("the process is vacated only below")
        };

        // Collect what is already in the pipes; after sys.exit() let the
        // process finish exiting (atexit handlers) first.
        match &outcome {
            Outcome::Reply(frame) => {
                if frame.int("tools_failed").is_some() {
                    proc.tools_installed = None; // sent again with the next cell
                }
                let dropped = frame.int("displays_dropped").unwrap_or(0);
                self.streams.displays.runner_dropped(
                    u32::try_from(dropped).unwrap_or(u32::MAX),
                    frame.text("displays_note"),
                );
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
        let breach = super::breach::find(&outcome, proc);
        let mut report = report::report(
            &outcome,
            stop,
            &mut info,
            self.opts.interrupt_grace,
            &stderr_tail,
            breach,
        );
        let shutdown = match outcome {
            Outcome::ShutDown(tx) => Some(tx),
            _ => None,
        };
        if let Some(v) = report.vacancy.take() {
            self.vacate(v).await;
        }
        let mut result = self.finish(report, info, started);
        result.tool_calls_made = tool_calls_made;
        (Ok(result), shutdown)
    }

    /// Turn the captures and the report into the cleaned, bounded result.
    fn finish(&mut self, report: Report, info: KernelInfo, started: Instant) -> CellResult {
        let [value, error, traceback, hint] = finish::clean_fields(
            &self.opts.output,
            &self.cleaner,
            [report.value, report.error, report.traceback, report.hint],
        );
        // Output that arrives from now on belongs to the next cell.
        let (mut out, mut err) = self.fresh_captures();
        let workspace = self.spill_workspace();
        let n = info.execution_count;
        if let Some((_, inside)) = &workspace {
            out.spill_hint(finish::spill_hint(inside, n, "stdout"));
            err.spill_hint(finish::spill_hint(inside, n, "stderr"));
        }
        let out = out.finish(&self.cleaner);
        let err = err.finish(&self.cleaner);
        let (full_out, full_err) = (out.full.as_deref(), err.full.as_deref());
        let spill_path = match &workspace {
            Some((host, inside)) => finish::spill_to_workspace(host, inside, n, full_out, full_err),
            None => finish::write_spill(&self.opts.spill_dir, &info, full_out, full_err),
        };
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
}

impl Actor {
    /// Where cut output goes: the workspace on the host and where the
    /// kernel sees it (`/workspace` when strict).
    fn spill_workspace(&self) -> Option<(PathBuf, PathBuf)> {
        if self.opts.sandbox.is_strict() {
            let host = self.workspace.clone()?;
            Some((host, PathBuf::from(crate::sandbox::WORKSPACE_IN_SANDBOX)))
        } else {
            let host = self.opts.workspace_dir.clone()?;
            Some((host.clone(), host))
        }
    }
}

impl Drop for Actor {
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
