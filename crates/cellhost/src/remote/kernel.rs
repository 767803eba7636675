//! A remote kernel: the actor behind a [`Kernel`] handle whose runner
//! lives on another host, container or pod, reached only through
//! run-to-completion exec.
//!
//! Start = one exec (`script::boot`): ship runner.py, display.py,
//! remote.py and the env file (RPC token) as base64 JSON on stdin into a
//! fresh 0700 dir, start the runner detached and wait for it to be ready.
//! A failed ship fails closed (no kernel, an error); a failed spawn fails
//! open (the cell runs one-shot, with a note). Each cell = one exec
//! (`script::cell`) that writes the request, wakes the runner and waits on
//! the remote side until the result is there, bounded by the cell timeout
//! (SIGINT, grace, kill of the process group). A runner found gone (idle
//! self-exit, restart, crash) means the next cell says `state_lost` and
//! runs in a fresh one; a cell is never sent twice once it may have run.
//! Any transport failure counts as the kernel's death.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use cellhost_protocol::{CellResult, KernelInfo};
use tokio::sync::{mpsc, oneshot};

use super::fleet::Lease;
use super::result::{Blob, Finisher};
use super::script;
use super::transport::{ExecOutput, Transport};
use crate::config::RemoteCommon;
use crate::kernel::frame::Frame;
use crate::kernel::Kernel;
use crate::kernel::{
    describe_outcome, Cell, Control, Displays, KernelError, KernelOptions, Observed, Outcome,
    Report, Request, SpawnError, Stop, RUNNER_FILES, RUNNER_SOURCE,
};
use crate::kernel::{StateChange, Vacancy};
use crate::output::Cleaner;
use crate::sys::random_hex;
use crate::tools::{Authority, DEFAULT_MAX_TOOL_CALLS};

/// Retires a cell's tool authority however the cell ends.
struct Retire(Arc<Authority>);

impl Drop for Retire {
    fn drop(&mut self) {
        self.0.retire();
    }
}

mod wait;

const REMOTE_SOURCE: &str = include_str!("../runner/remote.py");
/// Bytes of each stream the remote side returns per cell (head + tail).
const MAX_STREAM: u64 = 8 << 20;
/// Bound of the small control execs (interrupt, kill, cleanup).
const QUICK: Duration = Duration::from_secs(10);

/// How to start one remote kernel.
pub(crate) struct RemoteKernelOptions {
    pub backend: String,
    pub transport: Arc<dyn Transport>,
    /// Shut the transport down with the kernel (its own container).
    pub owns_transport: bool,
    pub common: RemoteCommon,
    pub idle_exit: Duration,
    /// Working dir on the remote side.
    pub cwd: Option<String>,
    /// Output and display limits, timeouts, spill dir, secrets to redact.
    pub kernel: KernelOptions,
    /// Fleet placement, released (dropped) with the kernel's actor.
    #[allow(dead_code)]
    pub lease: Option<Lease>,
}

struct Live {
    dir: String,
    pid: u32,
    id: String,
    count: u64,
    /// The RPC token shipped in the env file: tool requests must carry it.
    token: String,
    /// The runner has its `tools` module.
    tools_sent: bool,
}

/// How waiting for a cell ended.
enum Waited {
    /// The cell asked for a tool (request `k`); the phase it was in.
    Tool {
        k: u64,
        interrupted: bool,
        left: Option<Duration>,
        body: Vec<u8>,
        /// The request's full size (`body` is cut after the limit).
        size: u64,
    },
    Done(Outcome, Option<Stop>, Blob),
    NotDelivered(String),
    Transport(String),
}

enum Started {
    Live(Live),
    /// Shipped into `dir` but the runner did not start.
    SpawnFailed {
        dir: String,
        why: String,
    },
}

struct Actor {
    o: RemoteKernelOptions,
    live: Option<Live>,
    vacancy: Vacancy,
    /// Runners (or shipped dirs) given up on after a transport failure:
    /// killed before the next start and at teardown, and kept here until
    /// a kill has gone through (an outage may outlast several cells).
    stale: Vec<(String, Option<u32>)>,
    seq: u64,
    first: bool,
    observed: Arc<Observed>,
    cleaner: Cleaner,
}

/// Ship and start a remote kernel.
///
/// # Errors
/// [`SpawnError::Remote`] when the files could not be shipped (fail
/// closed). A runner that fails to start is not an error: the kernel's
/// cells run one-shot until a start succeeds (fail open).
pub(crate) async fn spawn(o: RemoteKernelOptions) -> Result<Kernel, SpawnError> {
    let observed = Arc::new(Observed::default());
    let cleaner = Cleaner::new(o.kernel.env.secrets.iter().cloned());
    let mut actor = Actor {
        o,
        live: None,
        vacancy: Vacancy::Quiet,
        stale: Vec::new(),
        seq: 0,
        first: true,
        observed: observed.clone(),
        cleaner,
    };
    match actor.start().await {
        Ok(Started::Live(live)) => actor.adopt(live),
        Ok(Started::SpawnFailed { dir, why }) => {
            // Fail open: the dir is reused by the one-shot of the first cell.
            actor.stale.push((dir, None));
            actor.vacancy = Vacancy::Told(StateChange::CouldNotStart { why });
        }
        Err(e) => {
            if actor.o.owns_transport {
                actor.o.transport.shutdown().await;
            }
            return Err(e);
        }
    }
    let (kernel, requests, control) = Kernel::from_actor(observed);
    tokio::spawn(actor.run(requests, control));
    Ok(kernel)
}

impl Actor {
    fn err(&self, detail: String) -> SpawnError {
        SpawnError::Remote {
            backend: self.o.backend.clone(),
            detail,
        }
    }

    async fn quick(&self, script: &str) -> Result<ExecOutput, String> {
        self.o
            .transport
            .exec(script, Vec::new(), Some(QUICK))
            .await
            .map_err(|e| e.to_string())
    }

    /// Kill the runners given up on; when the transport still fails they
    /// all stay for the next try.
    async fn reap_stale(&mut self) {
        while let Some((dir, pid)) = self.stale.last().cloned() {
            let s = script::kill(&dir, pid, self.o.kernel.teardown_grace);
            if self.quick(&s).await.is_err() {
                return;
            }
            self.stale.pop();
        }
    }

    /// Ship the files and start the runner (one exec).
    async fn start(&mut self) -> Result<Started, SpawnError> {
        self.reap_stale().await;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let token = random_hex(32);
        let mut args = vec![
            self.o.idle_exit.as_secs().max(1).to_string(),
            MAX_STREAM.to_string(),
        ];
        args.extend(self.o.cwd.clone());
        let mut files = serde_json::json!({
            "runner.py": b64(RUNNER_SOURCE),
            "remote.py": b64(REMOTE_SOURCE),
            "env": b64(&format!(
                "CELLHOST_RPC_TOKEN={token}\nCELLHOST_DISPLAY={},{},{}\n",
                crate::kernel::max_display_bytes(&self.o.kernel),
                self.o.kernel.display.max_cell_bytes,
                self.o.kernel.display.max_cell_displays
            )),
        });
        for (name, source) in RUNNER_FILES {
            files[*name] = b64(source).into();
        }
        let bundle = serde_json::json!({
            "tmp": self.o.common.tmpdir,
            "files": files,
            "args": args,
            "spawn_timeout": self.o.common.spawn_timeout().as_secs_f64(),
        });
        let deadline = self.o.common.spawn_timeout() + self.o.common.transport_timeout();
        let out = self
            .o
            .transport
            .exec(
                &script::boot(&self.o.common.python),
                bundle.to_string().into_bytes(),
                Some(deadline),
            )
            .await
            .map_err(|e| self.err(format!("could not ship the runner: {e}")))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut dir = None;
        for line in text.lines() {
            let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
            match word {
                "SHIPPED" => dir = Some(rest.to_owned()),
                "SHIPFAIL" => {
                    return Err(self.err(format!(
                        "could not ship the runner into the remote temp dir ({rest}); check the backend's tmpdir and disk space"
                    )))
                }
                "SPAWNED" if dir.is_some() => {
                    let pid = rest.trim().parse::<u32>().map_err(|_| {
                        self.err(format!("the remote bootstrap sent a bad pid {rest:?}"))
                    })?;
                    return Ok(Started::Live(Live {
                        dir: dir.unwrap_or_default(),
                        pid,
                        id: format!("r-{}", random_hex(6)),
                        count: 0,
                        token: token.clone(),
                        tools_sent: false,
                    }));
                }
                "SPAWNFAIL" if dir.is_some() => {
                    return Ok(Started::SpawnFailed {
                        dir: dir.unwrap_or_default(),
                        why: rest.to_owned(),
                    })
                }
                _ => {}
            }
        }
        match dir {
            Some(dir) => Ok(Started::SpawnFailed {
                dir,
                why: format!("the bootstrap stopped early: {}", out.stderr_line()),
            }),
            None => Err(self.err(format!(
                "could not ship the runner on {} ({}: {}); check that it is reachable and that {} exists there",
                self.o.transport.describe(),
                out.status.map_or("killed by a signal".to_owned(), |c| format!("exit status {c}")),
                out.stderr_line(),
                self.o.common.python
            ))),
        }
    }

    fn adopt(&mut self, live: Live) {
        self.observed.pid.store(live.pid, Ordering::Relaxed);
        self.observed.execution_count.store(0, Ordering::Relaxed);
        if let Ok(mut id) = self.observed.id.lock() {
            id.clone_from(&live.id);
        }
        self.live = Some(live);
    }

    /// Kill the live runner (best effort) and record why it is gone.
    async fn vacate(&mut self, why: Vacancy) {
        if let Some(live) = self.live.take() {
            let s = script::kill(&live.dir, Some(live.pid), self.o.kernel.teardown_grace);
            if self.quick(&s).await.is_err() {
                self.stale.push((live.dir, Some(live.pid)));
            }
        }
        self.vacancy = why;
        self.observed.pid.store(0, Ordering::Relaxed);
        if let Ok(mut id) = self.observed.id.lock() {
            id.clear();
        }
    }

    async fn teardown(&mut self) {
        self.vacate(Vacancy::Quiet).await;
        self.reap_stale().await;
        if self.o.owns_transport {
            self.o.transport.shutdown().await;
        }
    }

    async fn run(
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
            }
        }
    }

    async fn execute(
        &mut self,
        mut cell: Cell,
        control: &mut mpsc::UnboundedReceiver<Control>,
    ) -> (Result<CellResult, KernelError>, Option<oneshot::Sender<()>>) {
        let started = Instant::now();
        let mut info = KernelInfo {
            backend: self.o.backend.clone(),
            reused: !self.first,
            ..KernelInfo::default()
        };
        self.first = false;
        if cell.reset {
            self.vacate(Vacancy::Untold(StateChange::Reset)).await;
        }
        let timeout = cell.timeout.or(self.o.kernel.default_timeout);
        let mut displays = Displays::new(self.o.kernel.display.clone(), self.cleaner.clone());
        displays.begin(cell.events.take());
        // A fresh authority for every cell (one without tools refuses
        // calls with a reason), retired the moment it settles.
        let tool_set = cell.tools.take();
        let authority = Authority::new(
            tool_set.clone(),
            cell.allow.take(),
            cell.max_tool_calls.unwrap_or(DEFAULT_MAX_TOOL_CALLS),
        );
        let _retire = Retire(authority.clone());
        let mut retried = false;
        let (outcome, stop, blob) = loop {
            if self.live.is_none() {
                self.vacancy.describe_fresh(&mut info);
                match self.start().await {
                    Ok(Started::Live(live)) => self.adopt(live),
                    Ok(Started::SpawnFailed { dir, why }) => {
                        let r = self
                            .oneshot(
                                &cell.code,
                                &dir,
                                &why,
                                timeout,
                                info,
                                &mut displays,
                                started,
                            )
                            .await;
                        self.vacancy = Vacancy::Told(StateChange::CouldNotStart { why });
                        return (Ok(r), None);
                    }
                    Err(e) => return (Err(e.into()), None),
                }
            }
            let live = self.live.as_mut().expect("a live runner was just ensured");
            live.count += 1;
            self.seq += 1;
            info.id = live.id.clone();
            info.pid = Some(live.pid);
            info.execution_count = live.count;
            self.observed
                .execution_count
                .store(live.count, Ordering::Relaxed);
            let mut request = Frame::new()
                .with("op", "exec")
                .with("code", cell.code.as_bytes());
            if let Some(set) = &tool_set {
                if !live.tools_sent {
                    request = request
                        .with("tools", set.module_source().as_bytes())
                        .with("tools_max", self.o.kernel.max_tool_payload.to_string());
                    live.tools_sent = true;
                }
            }
            let tools = tool_set.is_some();
            match self
                .wait(request.encode(), timeout, control, &authority, tools)
                .await
            {
                Waited::NotDelivered(why) if !retried => {
                    retried = true;
                    self.vacate(Vacancy::Untold(StateChange::RemoteGone { why }))
                        .await;
                }
                Waited::NotDelivered(why) => {
                    break (
                        Outcome::Broken(format!("the fresh runner was gone at once ({why})")),
                        None,
                        Blob::default(),
                    )
                }
                Waited::Transport(detail) => {
                    let r = self.transport_lost(detail, info, started);
                    return (Ok(r), None);
                }
                Waited::Done(outcome, stop, blob) => break (outcome, stop, blob),
                Waited::Tool { .. } => unreachable!("wait() serves tool requests"),
            }
        };
        let tail = String::from_utf8_lossy(&blob.stderr).into_owned();
        let tail: String = tail
            .chars()
            .rev()
            .take(400)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let report = self.report(&outcome, stop, &mut info, &tail, &blob, &mut displays);
        let shutdown = match outcome {
            Outcome::ShutDown(tx) => Some(tx),
            _ => None,
        };
        let (report, vacancy) = report;
        if let Some(v) = vacancy {
            self.vacate(v).await;
        }
        let finisher = Finisher {
            output: &self.o.kernel.output,
            cleaner: &self.cleaner,
            spill_dir: &self.o.kernel.spill_dir,
        };
        let mut r = finisher.finish(
            report,
            info,
            &blob,
            &mut displays,
            started.elapsed().as_secs_f64(),
        );
        r.tool_calls_made = authority.made();
        (Ok(r), shutdown)
    }

    fn report(
        &self,
        outcome: &Outcome,
        stop: Option<Stop>,
        info: &mut KernelInfo,
        tail: &str,
        blob: &Blob,
        displays: &mut Displays,
    ) -> (Report, Option<Vacancy>) {
        for d in &blob.displays {
            displays.accept(d.clone());
        }
        if let Some(reply) = &blob.reply {
            let dropped = reply.int("displays_dropped").unwrap_or(0);
            displays.runner_dropped(
                u32::try_from(dropped).unwrap_or(u32::MAX),
                reply.text("displays_note"),
            );
        }
        let mut r = describe_outcome(
            outcome,
            stop,
            info,
            self.o.kernel.interrupt_grace,
            tail,
            None,
        );
        let v = r.vacancy.take();
        (r, v)
    }

    /// The connection failed while the cell was out: it may have run, so
    /// it is never sent again; the kernel counts as dead.
    fn transport_lost(
        &mut self,
        detail: String,
        mut info: KernelInfo,
        started: Instant,
    ) -> CellResult {
        if let Some(live) = self.live.take() {
            self.stale.push((live.dir, Some(live.pid)));
        }
        self.observed.pid.store(0, Ordering::Relaxed);
        let (report, vacancy) =
            crate::kernel::transport_lost(&mut info, &detail, self.o.transport.describe());
        self.vacancy = vacancy;
        let mut displays = Displays::new(self.o.kernel.display.clone(), self.cleaner.clone());
        Finisher {
            output: &self.o.kernel.output,
            cleaner: &self.cleaner,
            spill_dir: &self.o.kernel.spill_dir,
        }
        .finish(
            report,
            info,
            &Blob::default(),
            &mut displays,
            started.elapsed().as_secs_f64(),
        )
    }
}
