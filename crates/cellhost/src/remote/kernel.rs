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

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use cellhost_protocol::{CellResult, KernelInfo};
use tokio::sync::mpsc;

use super::files::RemoteWorkspace;
use super::fleet::Lease;
use super::result::{Blob, Finisher, Pending};
use super::script;
use super::transport::{ExecOutput, Transport};
use crate::config::RemoteCommon;
use crate::kernel::driver::{CellRun, Driver, LiveKernel, Ran, Settled, Start};
use crate::kernel::{
    describe_outcome, Actor, CellEvent, Displays, Kernel, KernelOptions, Observed, Outcome, Report,
    SpawnError, StateChange, Stop, Vacancy, RUNNER_FILES, RUNNER_SOURCE,
};
use crate::output::Cleaner;
use crate::sys::random_hex;
use crate::tools::ToolSet;

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
    /// The session's remote workspace, when `cwd` is its root: cut output
    /// is kept there (`.cellhost/output/`), where the next cell opens it.
    pub workspace: Option<RemoteWorkspace>,
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
    /// The tool set whose `tools` module the runner has.
    tools_installed: Option<ToolSet>,
}

impl LiveKernel for Live {
    fn id(&self) -> &str {
        &self.id
    }
    fn pid(&self) -> u32 {
        self.pid
    }
    fn count(&mut self) -> &mut u64 {
        &mut self.count
    }
    fn tools_installed(&mut self) -> &mut Option<ToolSet> {
        &mut self.tools_installed
    }
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

/// A shipped dir whose runner did not start, and why.
pub(crate) struct NotStarted {
    dir: String,
    why: String,
}

struct RemoteDriver {
    o: RemoteKernelOptions,
    /// Runners (or shipped dirs) given up on after a transport failure:
    /// killed before the next start and at teardown, and kept here until
    /// a kill has gone through (an outage may outlast several cells).
    stale: Vec<(String, Option<u32>)>,
    seq: u64,
    cleaner: Cleaner,
    /// The running cell's displays (from its result blob).
    displays: Displays,
}

/// Ship and start a remote kernel.
///
/// # Errors
/// [`SpawnError::Remote`] when the files could not be shipped (fail
/// closed). A runner that fails to start is not an error: the kernel's
/// cells run one-shot until a start succeeds (fail open).
pub(crate) async fn spawn(o: RemoteKernelOptions) -> Result<Kernel, SpawnError> {
    let cleaner = Cleaner::new(o.kernel.env.secrets.iter().cloned());
    let displays = Displays::new(o.kernel.display.clone(), cleaner.clone());
    let driver = RemoteDriver {
        o,
        stale: Vec::new(),
        seq: 0,
        cleaner,
        displays,
    };
    Actor::launch(driver, Arc::new(Observed::default())).await
}

impl RemoteDriver {
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

    fn finisher(&self) -> Finisher<'_> {
        Finisher {
            output: &self.o.kernel.output,
            cleaner: &self.cleaner,
            spill_dir: &self.o.kernel.spill_dir,
            workspace: self.o.workspace.as_ref().and(self.o.cwd.as_deref()),
        }
    }

    /// Write the full text of cut streams into the remote workspace (one
    /// exec each, contents on stdin) and name the first in the result.
    /// A failed write loses the spill (the marker still names the path),
    /// as a local kernel's does.
    async fn keep_spills(&self, (mut r, pending): (CellResult, Pending)) -> CellResult {
        let (Some(ws), Some(root)) = (&self.o.workspace, &self.o.cwd) else {
            return r;
        };
        for (name, text) in pending {
            match ws.spill(&name, &text).await {
                Ok(rel) => {
                    let path = std::path::Path::new(root).join(rel);
                    r.truncated
                        .spill_path
                        .get_or_insert_with(|| path.display().to_string());
                }
                Err(e) => eprintln!(
                    "cellhost: the full output {name} could not be kept in the remote workspace on {}: {e}",
                    ws.describe()
                ),
            }
        }
        r
    }

    /// What the report of a one-shot cell needs from its blob.
    fn report(
        &mut self,
        outcome: &Outcome,
        stop: Option<Stop>,
        info: &mut KernelInfo,
        blob: &Blob,
    ) -> Report {
        for d in &blob.displays {
            self.displays.accept(d.clone());
        }
        if let Some(reply) = &blob.reply {
            let dropped = reply.int("displays_dropped").unwrap_or(0);
            self.displays.runner_dropped(
                u32::try_from(dropped).unwrap_or(u32::MAX),
                reply.text("displays_note"),
            );
        }
        let mut r = describe_outcome(outcome, stop, info, self.o.kernel.interrupt_grace, "", None);
        r.vacancy = None;
        r
    }
}

impl Driver for RemoteDriver {
    type Live = Live;
    type Fallback = NotStarted;
    type Output = Blob;

    fn backend(&self) -> String {
        self.o.backend.clone()
    }

    fn options(&self) -> &KernelOptions {
        &self.o.kernel
    }

    fn displays(&mut self) -> &mut Displays {
        &mut self.displays
    }

    /// Ship the files and start the runner (one exec).
    async fn start(&mut self) -> Result<Start<Live, NotStarted>, SpawnError> {
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
                    return Ok(Start::Live(Live {
                        dir: dir.unwrap_or_default(),
                        pid,
                        id: format!("r-{}", random_hex(6)),
                        count: 0,
                        token: token.clone(),
                        tools_installed: None,
                    }));
                }
                "SPAWNFAIL" if dir.is_some() => {
                    return Ok(Start::Fallback(NotStarted {
                        dir: dir.unwrap_or_default(),
                        why: rest.to_owned(),
                    }))
                }
                _ => {}
            }
        }
        match dir {
            Some(dir) => Ok(Start::Fallback(NotStarted {
                dir,
                why: format!("the bootstrap stopped early: {}", out.stderr_line()),
            })),
            None => Err(self.err(format!(
                "could not ship the runner on {} ({}: {}); check that it is reachable and that {} exists there",
                self.o.transport.describe(),
                out.status.map_or("killed by a signal".to_owned(), |c| format!("exit status {c}")),
                out.stderr_line(),
                self.o.common.python
            ))),
        }
    }

    /// Kill the runner (best effort; kept for later when unreachable).
    async fn stop(&mut self, live: Live) {
        let s = script::kill(&live.dir, Some(live.pid), self.o.kernel.teardown_grace);
        if self.quick(&s).await.is_err() {
            self.stale.push((live.dir, Some(live.pid)));
        }
    }

    fn abandon(&mut self, live: Live) {
        self.stale.push((live.dir, Some(live.pid)));
    }

    fn begin(&mut self, sink: Option<mpsc::UnboundedSender<CellEvent>>) {
        self.displays = Displays::new(self.o.kernel.display.clone(), self.cleaner.clone());
        self.displays.begin(sink);
    }

    fn abandon_cell(&mut self) {
        self.displays = Displays::new(self.o.kernel.display.clone(), self.cleaner.clone());
    }

    fn snapshot_files(&self) -> bool {
        true
    }

    async fn run(&mut self, live: &mut Live, cell: CellRun<'_>) -> Ran<Blob> {
        self.seq += 1;
        match self
            .wait(
                live,
                cell.request,
                cell.timeout,
                cell.control,
                cell.authority,
                cell.tools,
            )
            .await
        {
            Waited::NotDelivered(why) => Ran::NotDelivered {
                again: Outcome::Broken(format!("the fresh runner was gone at once ({why})")),
                vacancy: Vacancy::Untold(StateChange::RemoteGone { why }),
            },
            Waited::Transport(detail) => Ran::Lost {
                detail,
                on: self.o.transport.describe(),
            },
            Waited::Done(outcome, stop, blob) => Ran::Done(outcome, stop, blob),
            Waited::Tool { .. } => unreachable!("wait() serves tool requests"),
        }
    }

    async fn settle(&mut self, _: &mut Live, _: &Outcome, blob: &mut Blob) -> Settled {
        for d in &blob.displays {
            self.displays.accept(d.clone());
        }
        let tail = String::from_utf8_lossy(&blob.stderr);
        let tail: String = tail
            .chars()
            .rev()
            .take(400)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        Settled {
            stderr_tail: tail,
            breach: None,
        }
    }

    async fn finish(
        &mut self,
        report: Report,
        info: KernelInfo,
        started: Instant,
        blob: Blob,
    ) -> CellResult {
        let mut displays = std::mem::replace(
            &mut self.displays,
            Displays::new(self.o.kernel.display.clone(), self.cleaner.clone()),
        );
        let finished = self.finisher().finish(
            report,
            info,
            &blob,
            &mut displays,
            started.elapsed().as_secs_f64(),
        );
        self.keep_spills(finished).await
    }

    async fn fallback(
        &mut self,
        f: NotStarted,
        code: &str,
        timeout: Option<Duration>,
        info: KernelInfo,
        started: Instant,
    ) -> (CellResult, Vacancy) {
        let r = self
            .oneshot(code, &f.dir, &f.why, timeout, info, started)
            .await;
        (r, Vacancy::Told(StateChange::CouldNotStart { why: f.why }))
    }

    fn park(&mut self, f: NotStarted) -> Vacancy {
        // Fail open: the first cell runs one-shot after trying again.
        self.stale.push((f.dir, None));
        Vacancy::Told(StateChange::CouldNotStart { why: f.why })
    }

    async fn teardown(&mut self) {
        self.reap_stale().await;
        if self.o.owns_transport {
            self.o.transport.shutdown().await;
        }
    }
}
