//! The kernel actor: the one task that owns a kernel process.
//!
//! It runs cells one at a time, keeps reading the process's stdout and
//! stderr between cells (output printed by leftover threads goes to the
//! next cell), enforces timeouts (SIGINT, grace, kill), notices a process
//! that died while idle, and respawns lazily on the next cell, saying in
//! the result why the state is gone.
//!
//! Output completeness without markers: the runner writes its reply only
//! after its own writes to fds 1 and 2 have returned, so once the reply
//! arrives every byte the cell wrote is already in the pipes. A
//! non-blocking drain after the reply collects it all.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellhost_protocol::{CellResult, KernelInfo, Status, Truncated};
use nix::sys::signal::Signal;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use super::frame::Frame;
use super::process::{private_dir, Exit, Process};
use super::{Cell, Control, KernelError, KernelOptions, Observed, Request, SpawnError};
use crate::interpreter::Interpreter;
use crate::output::{Capture, Cleaner};

const READ_CHUNK: usize = 64 * 1024;
/// Reads per readiness event, so a flooding cell cannot starve the rest.
const READS_PER_WAKE: usize = 16;

/// Why there is no live process, and what the next cell must be told.
#[derive(Debug, Clone)]
enum Vacancy {
    /// Reported already (ended, died in a cell, killed after a timeout):
    /// the next cell only says it got a fresh kernel.
    Reported(String),
    /// Died while idle: nobody knows yet that the state is gone.
    DiedIdle(Exit),
    /// The caller asked for a reset.
    Reset,
}

enum Slot {
    Live(Box<Process>),
    Vacant(Vacancy),
}

/// Why the runner is being asked to stop the cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Timeout(Duration),
    Interrupt,
}

/// How waiting for a cell ended.
enum Outcome {
    Reply(Frame),
    Died(Exit),
    KilledAfterGrace,
    Broken(String),
    ShutDown(tokio::sync::oneshot::Sender<()>),
}

/// One stream's reader state: the pipe hit EOF once every writer is gone.
struct Streams {
    out: Capture,
    err: Capture,
    out_eof: bool,
    err_eof: bool,
    ctrl_eof: bool,
}

pub(crate) struct Actor {
    opts: KernelOptions,
    python: PathBuf,
    cleaner: Cleaner,
    slot: Slot,
    streams: Streams,
    observed: Arc<Observed>,
    spill_seq: u64,
    /// The next cell is the first one of this kernel handle.
    first: bool,
    buf: Vec<u8>,
}

impl Actor {
    pub(crate) async fn start(
        opts: KernelOptions,
        interpreter: Interpreter,
        observed: Arc<Observed>,
    ) -> Result<Actor, SpawnError> {
        let python = interpreter.path().to_path_buf();
        let proc = Process::spawn(&opts, &python).await?;
        observed.pid.store(proc.pid, Ordering::Relaxed);
        let cleaner = Cleaner::new(opts.env.secrets.iter().cloned());
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
            },
            opts,
            python,
            cleaner,
            slot: Slot::Live(Box::new(proc)),
            observed,
            spill_seq: 0,
            first: true,
            buf: vec![0; READ_CHUNK],
        };
        actor.fresh_captures();
        Ok(actor)
    }

    fn fresh_captures(&mut self) {
        self.spill_seq += 1;
        let base = self.opts.spill_dir.join(format!(
            "{}-{}-{}",
            std::process::id(),
            self.observed.pid.load(Ordering::Relaxed),
            self.spill_seq
        ));
        self.streams.out = Capture::new(&self.opts.output, base.with_extension("stdout.raw"));
        self.streams.err = Capture::new(&self.opts.output, base.with_extension("stderr.raw"));
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
                () = self.idle_io() => {}
            }
        }
    }

    /// Between cells: keep the pipes drained and notice a death.
    async fn idle_io(&mut self) {
        let Slot::Live(proc) = &mut self.slot else {
            return std::future::pending().await;
        };
        let s = &mut self.streams;
        tokio::select! {
            r = proc.stdout.readable(), if !s.out_eof => {
                if r.is_err() || pump(&proc.stdout, &mut self.buf, &mut s.out) { s.out_eof = true; }
            }
            r = proc.stderr.readable(), if !s.err_eof => {
                if r.is_err() || pump(&proc.stderr, &mut self.buf, &mut s.err) { s.err_eof = true; }
            }
            r = proc.ctrl_rx.readable(), if !s.ctrl_eof => {
                // The runner never speaks unasked; EOF means it is going away.
                if r.is_err() || discard(&proc.ctrl_rx, &mut self.buf) { s.ctrl_eof = true; }
            }
            status = proc.child.wait() => {
                let exit = status.map(Exit::from_status).unwrap_or(Exit::Unknown);
                proc.exited = Some(exit);
                self.vacate(Vacancy::DiedIdle(exit)).await;
            }
        }
    }

    async fn teardown(&mut self) {
        if let Slot::Live(_) = self.slot {
            self.vacate(Vacancy::Reported(String::new())).await;
        }
        self.observed.pid.store(0, Ordering::Relaxed);
    }

    /// Kill the live process (if any) and record why.
    async fn vacate(&mut self, why: Vacancy) {
        if let Slot::Live(proc) = std::mem::replace(&mut self.slot, Slot::Vacant(why)) {
            proc.terminate(self.opts.teardown_grace).await;
        }
        self.observed.pid.store(0, Ordering::Relaxed);
    }

    async fn execute(
        &mut self,
        cell: Cell,
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
            self.vacate(Vacancy::Reset).await;
        } else if let Slot::Live(proc) = &mut self.slot {
            // It may have died since we last looked (idle I/O had no turn).
            if let Ok(Some(status)) = proc.child.try_wait() {
                let exit = Exit::from_status(status);
                proc.exited = Some(exit);
                self.vacate(Vacancy::DiedIdle(exit)).await;
            }
        }
        if let Slot::Vacant(why) = &self.slot {
            let why = why.clone();
            info.reused = false;
            match why {
                Vacancy::Reset => {
                    info.state_reset = true;
                    info.note = Some(
                        "The kernel was reset as asked: earlier state was discarded and this cell ran in a fresh kernel."
                            .into(),
                    );
                }
                Vacancy::DiedIdle(exit) => {
                    info.state_lost = true;
                    info.note = Some(format!(
                        "The previous kernel {} while idle, so its state was lost; this cell ran in a fresh kernel.",
                        exit.describe()
                    ));
                }
                Vacancy::Reported(why) if !why.is_empty() => {
                    info.note = Some(format!("This cell ran in a fresh kernel: {why}"));
                }
                Vacancy::Reported(_) => {}
            }
            match Process::spawn(&self.opts, &self.python).await {
                Ok(p) => {
                    self.observed.pid.store(p.pid, Ordering::Relaxed);
                    self.slot = Slot::Live(Box::new(p));
                    self.streams.out_eof = false;
                    self.streams.err_eof = false;
                    self.streams.ctrl_eof = false;
                }
                Err(e) => return (Err(e.into()), None),
            }
        }
        let Slot::Live(proc) = &mut self.slot else {
            unreachable!("a live process was just ensured")
        };
        proc.execution_count += 1;
        info.id = proc.id.clone();
        info.pid = Some(proc.pid);
        info.execution_count = proc.execution_count;

        let timeout = cell.timeout.or(self.opts.default_timeout);
        let request = Frame::new()
            .with("op", "exec")
            .with("code", cell.code.into_bytes())
            .encode();
        let (outcome, stop) = wait_for_cell(
            proc,
            &mut self.streams,
            &mut self.buf,
            request,
            timeout,
            self.opts.interrupt_grace,
            control,
        )
        .await;

        let mut status = Status::Success;
        let mut error: Option<String>;
        let mut traceback = None;
        let mut value = None;
        let mut shutdown = None;
        let stop_status = |stop: Option<Stop>| match stop {
            Some(Stop::Timeout(_)) => Status::Timeout,
            Some(Stop::Interrupt) => Status::Interrupted,
            None => Status::Error,
        };
        let mut vacancy = None;
        match outcome {
            Outcome::Reply(frame) => {
                drain(proc, &mut self.streams, &mut self.buf);
                value = frame.text("value");
                error = frame.text("error");
                traceback = frame.text("traceback");
                match frame.text("status").as_deref() {
                    Some("ok") => {}
                    Some("error") => status = Status::Error,
                    Some("interrupted") => {
                        status = match stop {
                            Some(Stop::Timeout(t)) => {
                                error = Some(format!(
                                    "Timeout: the cell ran longer than {} and was interrupted; the kernel and its state were kept",
                                    human(t)
                                ));
                                Status::Timeout
                            }
                            _ => Status::Interrupted,
                        }
                    }
                    Some("exit") => {
                        let code = frame.int("exit_code").unwrap_or(0);
                        if code != 0 {
                            status = Status::Error;
                            error = Some(format!("SystemExit: {code}"));
                        }
                        info.ended = true;
                        info.note = Some(format!(
                            "The kernel ended: the cell called sys.exit({code}). Its state is gone; the next cell starts a fresh kernel."
                        ));
                        // Let it finish exiting (atexit handlers), then reap.
                        let _ =
                            tokio::time::timeout(self.opts.teardown_grace, proc.child.wait()).await;
                        drain(proc, &mut self.streams, &mut self.buf);
                        vacancy = Some(Vacancy::Reported(
                            "the previous kernel ended with sys.exit().".into(),
                        ));
                    }
                    other => {
                        status = Status::Error;
                        error = Some(format!(
                            "cellhost: the runner replied with an unknown status {other:?}"
                        ));
                    }
                }
            }
            Outcome::Died(exit) => {
                drain(proc, &mut self.streams, &mut self.buf);
                status = stop_status(stop);
                let tail = self.streams.err.tail_text(400, &self.cleaner);
                let last = tail
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("");
                error = Some(if last.is_empty() {
                    format!(
                        "KernelDied: the kernel process {} during the cell",
                        exit.describe()
                    )
                } else {
                    format!(
                        "KernelDied: the kernel process {} during the cell; stderr ended with: {}",
                        exit.describe(),
                        last.trim()
                    )
                });
                info.state_lost = true;
                info.note = Some(format!(
                    "The kernel {} during this cell, so its state was lost; the next cell starts a fresh kernel.",
                    exit.describe()
                ));
                vacancy = Some(Vacancy::Reported(format!(
                    "the previous kernel {} during a cell.",
                    exit.describe()
                )));
            }
            Outcome::KilledAfterGrace => {
                drain(proc, &mut self.streams, &mut self.buf);
                status = stop_status(stop);
                let grace = human(self.opts.interrupt_grace);
                error = Some(match stop {
                    Some(Stop::Timeout(t)) => format!(
                        "Timeout: the cell ran longer than {} and did not stop within {grace} of the interrupt, so the kernel was killed",
                        human(t)
                    ),
                    _ => format!(
                        "Interrupted: the cell did not stop within {grace} of the interrupt, so the kernel was killed"
                    ),
                });
                info.state_lost = true;
                info.note = Some(
                    "The kernel was killed because the cell did not stop when interrupted, so its state was lost; the next cell starts a fresh kernel."
                        .into(),
                );
                vacancy = Some(Vacancy::Reported(
                    "the previous kernel was killed after an interrupt it ignored.".into(),
                ));
            }
            Outcome::Broken(detail) => {
                status = Status::Error;
                error = Some(format!(
                    "KernelProtocolError: {detail}; the kernel was killed"
                ));
                info.state_lost = true;
                info.note = Some(
                    "The kernel broke its control channel and was killed, so its state was lost; the next cell starts a fresh kernel."
                        .into(),
                );
                vacancy = Some(Vacancy::Reported(
                    "the previous kernel broke its control channel.".into(),
                ));
            }
            Outcome::ShutDown(tx) => {
                status = stop_status(stop);
                error = Some("KernelShutdown: the kernel was shut down during the cell".into());
                info.state_lost = true;
                info.note =
                    Some("The kernel was shut down during this cell; its state is gone.".into());
                shutdown = Some(tx);
            }
        }
        if let Some(v) = vacancy {
            self.vacate(v).await;
        }
        let result = self.finish(status, value, error, traceback, info, started);
        (Ok(result), shutdown)
    }

    /// Turn the captures into the cleaned, bounded result fields.
    fn finish(
        &mut self,
        status: Status,
        value: Option<String>,
        error: Option<String>,
        traceback: Option<String>,
        info: KernelInfo,
        started: Instant,
    ) -> CellResult {
        // Value, error and traceback: same cap and cleaning as the streams,
        // without a spill file (the runner already bounds them at 1 MiB).
        let limits = crate::output::OutputLimits {
            spill_cap_bytes: 0,
            ..self.opts.output.clone()
        };
        let clean_field = |s: Option<String>| {
            s.map(|s| {
                let mut c = Capture::new(&limits, PathBuf::new());
                c.push(s.as_bytes());
                c.finish(&self.cleaner).text
            })
        };
        let value = clean_field(value);
        let error = clean_field(error);
        let traceback = clean_field(traceback);
        self.fresh_captures_swap(status, value, error, traceback, info, started)
    }

    fn fresh_captures_swap(
        &mut self,
        status: Status,
        value: Option<String>,
        error: Option<String>,
        traceback: Option<String>,
        info: KernelInfo,
        started: Instant,
    ) -> CellResult {
        let out = std::mem::replace(
            &mut self.streams.out,
            Capture::new(&self.opts.output, PathBuf::new()),
        );
        let err = std::mem::replace(
            &mut self.streams.err,
            Capture::new(&self.opts.output, PathBuf::new()),
        );
        self.fresh_captures();
        let out = out.finish(&self.cleaner);
        let err = err.finish(&self.cleaner);
        let spill_path = self.write_spill(&info, out.full.as_deref(), err.full.as_deref());
        CellResult {
            status,
            stdout: out.text,
            stderr: err.text,
            value,
            error,
            traceback,
            displays: Vec::new(),
            truncated: Truncated {
                stdout: out.truncated,
                stderr: err.truncated,
                spill_path,
            },
            tool_calls_made: 0,
            duration_seconds: started.elapsed().as_secs_f64(),
            kernel: info,
        }
    }

    /// Write the full text of cut streams next to the session (not in the
    /// kernel's staging dir), owner-only.
    fn write_spill(
        &self,
        info: &KernelInfo,
        out: Option<&str>,
        err: Option<&str>,
    ) -> Option<String> {
        let text = match (out, err) {
            (None, None) => return None,
            (Some(o), None) => o.to_owned(),
            (None, Some(e)) => e.to_owned(),
            (Some(o), Some(e)) => format!("--- stdout ---\n{o}\n--- stderr ---\n{e}"),
        };
        let path = self
            .opts
            .spill_dir
            .join(format!("{}-cell-{}.txt", info.id, info.execution_count));
        let write = || -> io::Result<()> {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            private_dir(&self.opts.spill_dir)?;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&path)?;
            f.write_all(text.as_bytes())
        };
        write().ok().map(|()| path.display().to_string())
    }
}

/// Send the request and wait for the cell to settle, enforcing the
/// timeout (SIGINT, then kill after `grace`) and handling interrupts.
async fn wait_for_cell(
    proc: &mut Process,
    s: &mut Streams,
    buf: &mut [u8],
    request: Vec<u8>,
    timeout: Option<Duration>,
    grace: Duration,
    control: &mut mpsc::UnboundedReceiver<Control>,
) -> (Outcome, Option<Stop>) {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut stop: Option<Stop> = None;
    let mut kill_at: Option<tokio::time::Instant> = None;

    // Send the cell. write_all is not cancel safe, but if it is cancelled
    // the kernel is killed anyway.
    let send = async {
        let r = proc.ctrl_tx.write_all(&request).await;
        drop(request);
        r
    };
    let sent = tokio::select! {
        r = send => r.map_err(|e| format!("failed to send the cell: {e}")),
        status = proc.child.wait() => {
            let exit = status.map(Exit::from_status).unwrap_or(Exit::Unknown);
            proc.exited = Some(exit);
            return (Outcome::Died(exit), None);
        }
        () = sleep_until_opt(deadline) => Err("the kernel did not accept the cell before its timeout".into()),
    };
    if let Err(detail) = sent {
        // A runner that died just now closes its pipe: report the death.
        if let Ok(Ok(status)) =
            tokio::time::timeout(Duration::from_secs(1), proc.child.wait()).await
        {
            let exit = Exit::from_status(status);
            proc.exited = Some(exit);
            return (Outcome::Died(exit), None);
        }
        proc.kill_now().await;
        return (Outcome::Broken(detail), timeout.map(Stop::Timeout));
    }

    loop {
        let wake = match (stop, kill_at) {
            (_, Some(k)) => Some(k),
            (None, None) => deadline,
            (Some(_), None) => None,
        };
        tokio::select! {
            r = proc.ctrl_rx.readable(), if !s.ctrl_eof => {
                if r.is_err() {
                    s.ctrl_eof = true;
                    continue;
                }
                match proc.ctrl_rx.try_read(buf) {
                    Ok(0) => s.ctrl_eof = true,
                    Ok(n) => {
                        proc.frames.extend(&buf[..n]);
                        match proc.frames.next_frame() {
                            Ok(Some(frame)) if frame.text("op").as_deref() == Some("done") => {
                                return (Outcome::Reply(frame), stop);
                            }
                            Ok(Some(_)) => {
                                proc.kill_now().await;
                                return (Outcome::Broken("unexpected control frame".into()), stop);
                            }
                            Err(e) => {
                                proc.kill_now().await;
                                return (Outcome::Broken(format!("bad control frame: {e}")), stop);
                            }
                            Ok(None) => {}
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => s.ctrl_eof = true,
                }
            }
            r = proc.stdout.readable(), if !s.out_eof => {
                if r.is_err() || pump(&proc.stdout, buf, &mut s.out) { s.out_eof = true; }
            }
            r = proc.stderr.readable(), if !s.err_eof => {
                if r.is_err() || pump(&proc.stderr, buf, &mut s.err) { s.err_eof = true; }
            }
            status = proc.child.wait() => {
                let exit = status.map(Exit::from_status).unwrap_or(Exit::Unknown);
                proc.exited = Some(exit);
                return (Outcome::Died(exit), stop);
            }
            () = sleep_until_opt(wake) => {
                if kill_at.is_some() {
                    proc.kill_now().await;
                    return (Outcome::KilledAfterGrace, stop);
                }
                // The deadline passed: interrupt first, kill only if needed.
                stop = timeout.map(Stop::Timeout);
                proc.signal(Signal::SIGINT);
                kill_at = Some(tokio::time::Instant::now() + grace);
            }
            ctl = control.recv() => match ctl {
                Some(Control::Interrupt(tx)) => {
                    if stop.is_none() {
                        stop = Some(Stop::Interrupt);
                        proc.signal(Signal::SIGINT);
                        kill_at = Some(tokio::time::Instant::now() + grace);
                    } else {
                        // A repeated interrupt: signal again, keep the
                        // original deadline for the kill.
                        proc.signal(Signal::SIGINT);
                    }
                    let _ = tx.send(true);
                }
                Some(Control::Shutdown(tx)) => {
                    proc.kill_now().await;
                    return (Outcome::ShutDown(tx), stop);
                }
                None => {
                    // Every handle is gone: nobody will read the result.
                    proc.kill_now().await;
                    return (Outcome::Broken("all kernel handles were dropped".into()), stop);
                }
            },
        }
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Read what is available into `sink`. Returns `true` at EOF.
fn pump(rx: &pipe::Receiver, buf: &mut [u8], sink: &mut Capture) -> bool {
    for _ in 0..READS_PER_WAKE {
        match rx.try_read(buf) {
            Ok(0) => return true,
            Ok(n) => sink.push(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
    false
}

fn discard(rx: &pipe::Receiver, buf: &mut [u8]) -> bool {
    loop {
        match rx.try_read(buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// After the reply: collect everything already in the pipes. Bounded, so
/// a leftover background writer cannot keep us here.
fn drain(proc: &Process, s: &mut Streams, buf: &mut [u8]) {
    for _ in 0..64 {
        let out_done = s.out_eof || {
            let eof = pump_once(&proc.stdout, buf, &mut s.out);
            s.out_eof |= eof == Some(true);
            eof.is_some()
        };
        let err_done = s.err_eof || {
            let eof = pump_once(&proc.stderr, buf, &mut s.err);
            s.err_eof |= eof == Some(true);
            eof.is_some()
        };
        if out_done && err_done {
            return;
        }
    }
}

/// One read: `Some(true)` at EOF, `Some(false)` when empty, `None` when it
/// got bytes (there may be more).
///
/// This is a direct `read(2)` on the non-blocking fd, not `try_read`:
/// tokio's `try_read` answers `WouldBlock` without a syscall when its
/// reactor has not yet seen the readiness event, which would lose bytes
/// that are already in the pipe.
fn pump_once(rx: &pipe::Receiver, buf: &mut [u8], sink: &mut Capture) -> Option<bool> {
    use std::os::fd::AsFd;
    match nix::unistd::read(rx.as_fd(), buf) {
        Ok(0) => Some(true),
        Ok(n) => {
            sink.push(&buf[..n]);
            None
        }
        Err(nix::errno::Errno::EAGAIN) => Some(false),
        Err(nix::errno::Errno::EINTR) => None,
        Err(_) => Some(true),
    }
}

/// `2s`, `1.5s`, `250ms`.
fn human(d: Duration) -> String {
    if d.as_millis() % 1000 == 0 {
        format!("{}s", d.as_secs())
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}
