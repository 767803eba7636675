//! The session actor's state machine driven by an in-memory driver: every
//! vacancy, reset, retry and loss path, without Python.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use cellhost_protocol::{Status, Truncated};
use serde_json::{json, Value};

use super::*;
use crate::kernel::display::{CellEvent, DisplayLimits, Displays};
use crate::kernel::driver::Settled;
use crate::kernel::frame::FrameReader;
use crate::kernel::process::Exit;
use crate::kernel::report::Report;
use crate::kernel::wait::Stop;
use crate::kernel::KernelOptions;
use crate::output::Cleaner;
use crate::tools::{AuthoritySlot, FnTool};

/// What the next start gives.
enum Boot {
    Live,
    Fail,
    Fallback,
}

/// How the next cell goes.
enum Step {
    Reply(&'static [(&'static str, &'static str)]),
    NotDelivered,
    Lost,
    Died,
    /// Wait for an interrupt (the cell then replies `interrupted`) or a
    /// shutdown.
    Hang,
}

#[derive(Default)]
struct Script {
    boots: VecDeque<Boot>,
    steps: VecDeque<Step>,
    /// What the actor asked, in order: `start f-1`, `stop f-1`, `run f-1`…
    log: Vec<String>,
    /// The `exec` frames sent.
    requests: Vec<Frame>,
    /// Each cell's authority, and whether it was in the slot during the cell.
    authorities: Vec<(Arc<Authority>, bool)>,
}

struct Fake {
    script: Arc<Mutex<Script>>,
    opts: KernelOptions,
    displays: Displays,
    started: u32,
    idle: mpsc::UnboundedReceiver<Vacancy>,
    slot: AuthoritySlot,
}

struct FakeLive {
    id: String,
    pid: u32,
    count: u64,
    tools: Option<ToolSet>,
}

impl LiveKernel for FakeLive {
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
        &mut self.tools
    }
}

impl Fake {
    fn log(&self, line: String) {
        self.script.lock().unwrap().log.push(line);
    }
}

fn reply(pairs: &[(&str, &str)]) -> Outcome {
    let mut f = Frame::new();
    for (k, v) in pairs {
        f = f.with(k, *v);
    }
    Outcome::Reply(f)
}

const OK: &[(&str, &str)] = &[("status", "ok"), ("value", "82")];

impl Driver for Fake {
    type Live = FakeLive;
    type Fallback = String;
    type Output = ();

    fn backend(&self) -> String {
        "fake".into()
    }
    fn options(&self) -> &KernelOptions {
        &self.opts
    }
    fn authority_slot(&self) -> Option<&AuthoritySlot> {
        Some(&self.slot)
    }
    fn displays(&mut self) -> &mut Displays {
        &mut self.displays
    }

    async fn start(&mut self) -> Result<Start<FakeLive, String>, SpawnError> {
        let boot = self.script.lock().unwrap().boots.pop_front();
        match boot.unwrap_or(Boot::Live) {
            Boot::Live => {
                self.started += 1;
                let id = format!("f-{}", self.started);
                self.log(format!("start {id}"));
                Ok(Start::Live(FakeLive {
                    id,
                    pid: 1000 + self.started,
                    count: 0,
                    tools: None,
                }))
            }
            Boot::Fail => {
                self.log("start failed".into());
                Err(SpawnError::Handshake {
                    detail: "no python".into(),
                })
            }
            Boot::Fallback => {
                self.log("start fell back".into());
                Ok(Start::Fallback("python3: not found".into()))
            }
        }
    }

    async fn stop(&mut self, live: FakeLive) {
        self.log(format!("stop {}", live.id));
    }

    fn abandon(&mut self, live: FakeLive) {
        self.log(format!("abandon {}", live.id));
    }

    async fn idle(&mut self, _: &mut FakeLive) -> Option<Vacancy> {
        match self.idle.recv().await {
            Some(v) => Some(v),
            None => std::future::pending().await,
        }
    }

    fn begin(&mut self, sink: Option<mpsc::UnboundedSender<CellEvent>>) {
        self.displays.begin(sink);
    }

    fn abandon_cell(&mut self) {
        self.log("abandon cell".into());
        self.displays.abandon();
    }

    async fn run(&mut self, live: &mut FakeLive, cell: CellRun<'_>) -> Ran<()> {
        let mut reader = FrameReader::default();
        reader.extend(&cell.request);
        let frame = reader.next_frame().unwrap().unwrap();
        let armed = self
            .slot
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|a| Arc::ptr_eq(a, cell.authority));
        let step = {
            let mut s = self.script.lock().unwrap();
            s.requests.push(frame);
            s.authorities.push((cell.authority.clone(), armed));
            s.log.push(format!("run {}", live.id));
            s.steps.pop_front()
        };
        match step.unwrap_or(Step::Reply(OK)) {
            Step::Reply(pairs) => Ran::Done(reply(pairs), None, ()),
            Step::NotDelivered => Ran::NotDelivered {
                vacancy: Vacancy::Untold(StateChange::DiedIdle {
                    how: Exit::Signal(9).describe(),
                }),
                again: Outcome::NotDelivered(Exit::Signal(9)),
            },
            Step::Lost => Ran::Lost {
                detail: "connection refused".into(),
                on: "fake host".into(),
            },
            Step::Died => Ran::Done(Outcome::Died(Exit::Signal(11)), None, ()),
            Step::Hang => match cell.control.recv().await {
                Some(Control::Interrupt(tx)) => {
                    let _ = tx.send(true);
                    Ran::Done(
                        reply(&[("status", "interrupted"), ("error", "KeyboardInterrupt")]),
                        Some(Stop::Interrupt),
                        (),
                    )
                }
                Some(Control::Shutdown(tx)) => Ran::Done(Outcome::ShutDown(tx), None, ()),
                None => Ran::Done(Outcome::Broken("all handles dropped".into()), None, ()),
            },
        }
    }

    async fn settle(&mut self, _: &mut FakeLive, _: &Outcome, (): &mut ()) -> Settled {
        Settled::default()
    }

    async fn finish(&mut self, report: Report, info: KernelInfo, _: Instant, (): ()) -> CellResult {
        let (displays, _, _) = self.displays.finish();
        CellResult {
            status: report.status,
            stdout: String::new(),
            stderr: String::new(),
            value: report.value,
            error: report.error,
            traceback: report.traceback,
            hint: report.hint,
            displays,
            value_display: None,
            truncated: Truncated::default(),
            tool_calls_made: 0,
            duration_seconds: 0.0,
            kernel: info,
        }
    }

    async fn fallback(
        &mut self,
        why: String,
        _: &str,
        _: Option<Duration>,
        mut info: KernelInfo,
        _: Instant,
    ) -> (CellResult, Vacancy) {
        self.log("one-shot".into());
        info.id = "f-oneshot".into();
        let report = Report {
            status: Status::Success,
            value: Some("82".into()),
            error: None,
            traceback: None,
            hint: None,
            vacancy: None,
        };
        let mut r = self.finish(report, info, Instant::now(), ()).await;
        let change = StateChange::CouldNotStart { why };
        change.tell(&mut r.kernel);
        (r, Vacancy::Told(change))
    }

    fn park(&mut self, why: String) -> Vacancy {
        self.log("park".into());
        Vacancy::Told(StateChange::CouldNotStart { why })
    }

    async fn teardown(&mut self) {
        self.log("teardown".into());
    }
}

struct Harness {
    kernel: Kernel,
    script: Arc<Mutex<Script>>,
    idle: mpsc::UnboundedSender<Vacancy>,
}

impl Harness {
    async fn new(boots: Vec<Boot>, steps: Vec<Step>) -> Result<Harness, SpawnError> {
        let script = Arc::new(Mutex::new(Script {
            boots: boots.into(),
            steps: steps.into(),
            ..Script::default()
        }));
        let (idle, idle_rx) = mpsc::unbounded_channel();
        let fake = Fake {
            script: script.clone(),
            opts: KernelOptions::default(),
            displays: Displays::new(DisplayLimits::default(), Cleaner::new(Vec::<String>::new())),
            started: 0,
            idle: idle_rx,
            slot: AuthoritySlot::default(),
        };
        let kernel = Actor::launch(fake, Arc::new(Observed::default())).await?;
        Ok(Harness {
            kernel,
            script,
            idle,
        })
    }

    async fn cell(&self, cell: Cell) -> CellResult {
        self.kernel.execute(cell).await.expect("the cell ran")
    }

    async fn ok(&self) -> CellResult {
        self.cell(Cell::new("x = 82")).await
    }

    fn log(&self) -> Vec<String> {
        self.script.lock().unwrap().log.clone()
    }

    /// The actor's log once `line` is in it.
    async fn log_until(&self, line: &str) -> Vec<String> {
        for _ in 0..200 {
            let log = self.log();
            if log.iter().any(|l| l == line) {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("{line:?} never logged: {:?}", self.log());
    }
}

fn note(r: &CellResult) -> &str {
    r.kernel.note.as_deref().unwrap_or("")
}

#[tokio::test]
async fn cells_reuse_the_kernel_and_count() {
    let h = Harness::new(vec![], vec![]).await.unwrap();
    let first = h.ok().await;
    let second = h.ok().await;
    assert!(!first.kernel.reused && second.kernel.reused);
    assert_eq!(second.kernel.execution_count, 2);
    assert_eq!(second.kernel.id, "f-1");
    assert_eq!(second.kernel.backend, "fake");
    assert_eq!(h.kernel.pid(), Some(1001));
    assert_eq!(h.kernel.execution_count(), 2);
    assert!(!second.kernel.state_lost && second.kernel.note.is_none());
    assert_eq!(h.log(), ["start f-1", "run f-1", "run f-1"]);
}

#[tokio::test]
async fn a_reset_stops_the_kernel_and_says_so() {
    let h = Harness::new(vec![], vec![]).await.unwrap();
    h.ok().await;
    let r = h.cell(Cell::new("x").reset(true)).await;
    assert!(r.kernel.state_reset && !r.kernel.state_lost && !r.kernel.reused);
    assert_eq!(r.kernel.id, "f-2");
    assert_eq!(r.kernel.execution_count, 1);
    assert!(
        note(&r).starts_with("The kernel was reset as asked"),
        "{}",
        note(&r)
    );
    assert_eq!(
        h.log(),
        ["start f-1", "run f-1", "stop f-1", "start f-2", "run f-2"]
    );
}

#[tokio::test]
async fn a_death_while_idle_is_told_by_the_next_cell() {
    let h = Harness::new(vec![], vec![]).await.unwrap();
    h.ok().await;
    h.idle
        .send(Vacancy::Untold(StateChange::DiedIdle {
            how: Exit::Signal(9).describe(),
        }))
        .unwrap();
    h.log_until("stop f-1").await;
    assert_eq!(h.kernel.pid(), None, "observers see no process");
    assert_eq!(h.kernel.process_id(), "");
    let r = h.ok().await;
    assert!(r.kernel.state_lost && !r.kernel.reused);
    assert_eq!(
        note(&r),
        "The previous kernel was killed by signal 9 (SIGKILL) while idle, so its state was lost; this cell ran in a fresh kernel."
    );
    assert_eq!(r.kernel.id, "f-2");
}

#[tokio::test]
async fn a_cell_that_never_reached_its_kernel_runs_once_more_in_a_fresh_one() {
    let h = Harness::new(vec![], vec![Step::Reply(OK), Step::NotDelivered])
        .await
        .unwrap();
    h.ok().await;
    let r = h.ok().await;
    assert_eq!(r.status, Status::Success);
    assert!(r.kernel.state_lost);
    assert!(note(&r).contains("while idle"), "{}", note(&r));
    assert_eq!((r.kernel.id.as_str(), r.kernel.execution_count), ("f-2", 1));
    assert_eq!(
        h.log(),
        [
            "start f-1",
            "run f-1",
            "run f-1",
            "stop f-1",
            "start f-2",
            "run f-2"
        ]
    );
}

#[tokio::test]
async fn a_cell_that_reaches_no_kernel_twice_is_a_death_and_is_not_sent_again() {
    let h = Harness::new(vec![], vec![Step::NotDelivered, Step::NotDelivered])
        .await
        .unwrap();
    let r = h.ok().await;
    assert_eq!(r.status, Status::Error);
    assert!(r.error.as_deref().unwrap().starts_with("KernelDied:"));
    assert!(r.kernel.state_lost);
    assert_eq!(
        h.log(),
        [
            "start f-1",
            "run f-1",
            "stop f-1",
            "start f-2",
            "run f-2",
            "stop f-2"
        ]
    );
    let next = h.ok().await;
    assert_eq!(
        note(&next),
        "This cell ran in a fresh kernel: the previous kernel was killed by signal 9 (SIGKILL) during a cell."
    );
    assert!(!next.kernel.state_lost, "the loss was told already");
}

#[tokio::test]
async fn a_lost_connection_is_never_retried_and_the_kernel_is_abandoned() {
    let h = Harness::new(vec![], vec![Step::Lost]).await.unwrap();
    let r = h.ok().await;
    assert_eq!(r.status, Status::Error);
    assert!(r
        .error
        .as_deref()
        .unwrap()
        .starts_with("TransportError: connection refused."));
    assert!(r.kernel.state_lost);
    assert!(
        note(&r).contains("on fake host failed during this cell"),
        "{}",
        note(&r)
    );
    assert_eq!(h.kernel.pid(), None);
    assert_eq!(h.log(), ["start f-1", "run f-1", "abandon f-1"]);
    let next = h.ok().await;
    assert_eq!(next.kernel.id, "f-2");
    assert!(note(&next).contains("the connection to the previous remote kernel failed"));
}

#[tokio::test]
async fn a_death_in_a_cell_is_told_there_and_the_next_cell_gets_a_fresh_kernel() {
    let h = Harness::new(vec![], vec![Step::Died]).await.unwrap();
    let r = h.ok().await;
    assert!(r.kernel.state_lost);
    assert!(note(&r).contains("during this cell"));
    let next = h.ok().await;
    assert!(!next.kernel.state_lost && !next.kernel.reused);
    assert_eq!(
        h.log(),
        ["start f-1", "run f-1", "stop f-1", "start f-2", "run f-2"]
    );
}

#[tokio::test]
async fn sys_exit_ends_the_kernel() {
    let h = Harness::new(
        vec![],
        vec![Step::Reply(&[("status", "exit"), ("exit_code", "0")])],
    )
    .await
    .unwrap();
    let r = h.ok().await;
    assert_eq!(r.status, Status::Success);
    assert!(r.kernel.ended && !r.kernel.state_lost);
    let next = h.ok().await;
    assert_eq!(
        note(&next),
        "This cell ran in a fresh kernel: the previous kernel ended with sys.exit()."
    );
}

#[tokio::test]
async fn a_failed_restart_is_an_error_that_closes_the_events_and_the_next_cell_tries_again() {
    let h = Harness::new(vec![Boot::Live, Boot::Fail], vec![Step::Died])
        .await
        .unwrap();
    h.ok().await;
    let (tx, mut events) = mpsc::unbounded_channel();
    let e = h
        .kernel
        .execute(Cell::new("x").events(tx))
        .await
        .unwrap_err();
    assert!(
        matches!(e, KernelError::Spawn(SpawnError::Handshake { .. })),
        "{e}"
    );
    assert!(events.recv().await.is_none(), "the sink was released");
    let r = h.ok().await;
    assert_eq!(r.status, Status::Success);
    assert_eq!(r.kernel.id, "f-2");
    assert!(note(&r).starts_with("This cell ran in a fresh kernel: the previous kernel was killed"));
    assert_eq!(
        h.log(),
        [
            "start f-1",
            "run f-1",
            "stop f-1",
            "start failed",
            "abandon cell",
            "start f-2",
            "run f-2"
        ]
    );
}

#[tokio::test]
async fn a_failed_first_start_tears_down() {
    let e = Harness::new(vec![Boot::Fail], vec![]).await.err().unwrap();
    assert!(matches!(e, SpawnError::Handshake { .. }));
}

#[tokio::test]
async fn a_start_that_falls_back_runs_cells_one_shot_until_one_starts() {
    let h = Harness::new(vec![Boot::Fallback, Boot::Fallback], vec![])
        .await
        .unwrap();
    let r = h.ok().await;
    assert_eq!(r.kernel.id, "f-oneshot");
    assert!(note(&r).starts_with(
        "The remote kernel could not start (python3: not found), so this cell ran one-shot"
    ));
    assert!(note(&r).ends_with("This cell ran in a fresh kernel: the remote runner could not start earlier (python3: not found)."));
    let r = h.ok().await;
    assert_eq!(r.kernel.id, "f-1");
    assert_eq!(
        note(&r),
        "This cell ran in a fresh kernel: the remote runner could not start earlier (python3: not found)."
    );
    assert_eq!(
        h.log(),
        [
            "start fell back",
            "park",
            "start fell back",
            "one-shot",
            "start f-1",
            "run f-1"
        ]
    );
}

#[tokio::test]
async fn an_interrupt_reaches_the_running_cell_only() {
    let h = Harness::new(vec![], vec![Step::Hang]).await.unwrap();
    assert!(!h.kernel.interrupt().await.unwrap(), "no cell runs");
    let k = h.kernel.clone();
    let cell = tokio::spawn(async move { k.execute(Cell::new("while True: pass")).await });
    h.log_until("run f-1").await;
    assert!(h.kernel.is_busy());
    assert!(h.kernel.interrupt().await.unwrap());
    let r = cell.await.unwrap().unwrap();
    assert_eq!(r.status, Status::Interrupted);
    assert!(
        !r.kernel.state_lost && r.kernel.note.is_none(),
        "state kept"
    );
    assert!(!h.kernel.is_busy());
    assert_eq!(h.ok().await.kernel.execution_count, 2);
}

#[tokio::test]
async fn a_shutdown_during_a_cell_ends_it_and_the_kernel() {
    let h = Harness::new(vec![], vec![Step::Hang]).await.unwrap();
    let k = h.kernel.clone();
    let cell = tokio::spawn(async move { k.execute(Cell::new("while True: pass")).await });
    h.log_until("run f-1").await;
    h.kernel.shutdown().await;
    let r = cell.await.unwrap().unwrap();
    assert_eq!(r.status, Status::Error);
    assert!(r.kernel.state_lost);
    assert_eq!(
        note(&r),
        "The kernel was shut down during this cell; its state is gone."
    );
    assert!(matches!(
        h.kernel.execute(Cell::new("x")).await,
        Err(KernelError::Closed)
    ));
    assert_eq!(h.log(), ["start f-1", "run f-1", "stop f-1", "teardown"]);
}

#[tokio::test]
async fn dropping_every_handle_tears_down() {
    let h = Harness::new(vec![], vec![]).await.unwrap();
    h.ok().await;
    let Harness { kernel, script, .. } = h;
    drop(kernel);
    for _ in 0..200 {
        if script.lock().unwrap().log.iter().any(|l| l == "teardown") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        script.lock().unwrap().log,
        ["start f-1", "run f-1", "stop f-1", "teardown"]
    );
}

fn tool_set() -> ToolSet {
    let t = FnTool::new("lookup", "x", json!({}), |_| {
        std::future::ready(Ok::<_, crate::tools::ToolError>(Value::Null))
    });
    ToolSet::new().with(t).unwrap()
}

#[tokio::test]
async fn each_cell_has_its_own_authority_armed_while_it_runs_and_retired_after() {
    let h = Harness::new(vec![], vec![]).await.unwrap();
    h.cell(Cell::new("x").tools(tool_set())).await;
    h.ok().await;
    let auths = h.script.lock().unwrap().authorities.clone();
    assert_eq!(auths.len(), 2);
    assert!(
        !Arc::ptr_eq(&auths[0].0, &auths[1].0),
        "a fresh authority per cell"
    );
    for (a, armed) in &auths {
        assert!(armed, "installed in the slot while the cell ran");
        tokio::time::timeout(Duration::from_secs(1), a.retired())
            .await
            .expect("retired once the cell settled");
    }
}

#[tokio::test]
async fn the_tools_module_is_sent_once_per_kernel_and_again_after_it_failed() {
    let h = Harness::new(
        vec![],
        vec![
            Step::Reply(&[("status", "ok"), ("tools_failed", "1")]),
            Step::Reply(OK),
            Step::Reply(OK),
        ],
    )
    .await
    .unwrap();
    let set = tool_set();
    for _ in 0..3 {
        h.cell(Cell::new("x").tools(set.clone())).await;
    }
    h.cell(Cell::new("x").tools(set).reset(true)).await;
    let sent: Vec<bool> = h
        .script
        .lock()
        .unwrap()
        .requests
        .iter()
        .map(|f| f.text("tools").is_some())
        .collect();
    assert_eq!(sent, [true, true, false, true]);
}
