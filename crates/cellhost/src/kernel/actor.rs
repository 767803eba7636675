//! The session actor: the one task that owns a kernel, whatever drives it.
//!
//! It runs cells one at a time, watches the kernel between cells (through
//! its [`Driver`]), starts a fresh kernel lazily on the next cell after a
//! reset or a loss, runs a cell that never reached its kernel once more
//! in a fresh one, installs each cell's tool authority and retires it
//! when the cell settles, and has the result say what happened to the
//! state (`report.rs` writes every sentence).

use std::sync::Arc;
use std::time::Instant;

use cellhost_protocol::{CellResult, KernelInfo};
use tokio::sync::{mpsc, oneshot};

use super::driver::{CellRun, Driver, LiveKernel, Ran, Start};
use super::frame::Frame;
use super::report::{self, StateChange, Vacancy};
use super::wait::Outcome;
use super::{Cell, Control, Kernel, KernelError, Observed, Request, SpawnError};
use crate::tools::{self, Authority, ToolSet, DEFAULT_MAX_TOOL_CALLS};

/// The live kernel, or why there is none.
enum Slot<L> {
    Live(L),
    Vacant(Vacancy),
}

pub(crate) struct Actor<D: Driver> {
    driver: D,
    slot: Slot<D::Live>,
    observed: Arc<Observed>,
    /// The next cell is the first one of this kernel handle.
    first: bool,
}

/// What one cell gave back: its result, and the shutdown it ended in.
type Executed = (Result<CellResult, KernelError>, Option<oneshot::Sender<()>>);

impl<D: Driver> Actor<D> {
    /// Start the first kernel and the actor's task; `observed` is what
    /// the handle reads.
    ///
    /// # Errors
    /// The driver's start failed (after its teardown).
    pub(crate) async fn launch(
        mut driver: D,
        observed: Arc<Observed>,
    ) -> Result<Kernel, SpawnError> {
        let live = match driver.start().await {
            Ok(Start::Live(live)) => Some(live),
            Ok(Start::Fallback(f)) => {
                let why = driver.park(f);
                let actor = Actor::new(driver, Slot::Vacant(why), observed.clone());
                return Ok(actor.spawn());
            }
            Err(e) => {
                driver.teardown().await;
                return Err(e);
            }
        };
        let mut actor = Actor::new(driver, Slot::Vacant(Vacancy::Quiet), observed);
        if let Some(live) = live {
            actor.adopt(live);
        }
        Ok(actor.spawn())
    }

    fn new(driver: D, slot: Slot<D::Live>, observed: Arc<Observed>) -> Actor<D> {
        Actor {
            driver,
            slot,
            observed,
            first: true,
        }
    }

    fn spawn(self) -> Kernel {
        let (kernel, requests, control) = Kernel::from_actor(self.observed.clone());
        tokio::spawn(self.run(requests, control));
        kernel
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
                        self.observed.update(|s| s.busy = true);
                        let (result, shutdown) = self.execute(cell, &mut control).await;
                        self.observed.update(|s| s.busy = false);
                        let _ = tx.send(result);
                        if let Some(done) = shutdown {
                            self.teardown().await;
                            let _ = done.send(());
                            return;
                        }
                    }
                    Some(Request::Op(request, timeout, tx)) => {
                        self.observed.update(|s| s.busy = true);
                        let (turned, ()) = self
                            .op_turn(request, timeout, &mut control, std::future::ready(()))
                            .await;
                        self.observed.update(|s| s.busy = false);
                        let (result, shutdown) = op::answer(turned, timeout);
                        let _ = tx.send(result);
                        if let Some(done) = shutdown {
                            self.teardown().await;
                            let _ = done.send(());
                            return;
                        }
                    }
                    Some(Request::Snapshot(job, timeout, tx)) => {
                        self.observed.update(|s| s.busy = true);
                        let (result, shutdown) = self.snapshot(job, timeout, &mut control).await;
                        self.observed.update(|s| s.busy = false);
                        let _ = tx.send(result);
                        if let Some(done) = shutdown {
                            self.teardown().await;
                            let _ = done.send(());
                            return;
                        }
                    }
                    None => { self.teardown().await; return; }
                },
                why = idle(&mut self.driver, &mut self.slot) => {
                    if let Some(why) = why {
                        self.vacate(why).await;
                    }
                }
            }
        }
    }

    async fn teardown(&mut self) {
        self.vacate(Vacancy::Quiet).await;
        self.driver.teardown().await;
    }

    /// A kernel handle on `live`, a process started elsewhere (a fork of
    /// another kernel's), driven by `driver` from now on.
    pub(crate) fn adopting(driver: D, live: D::Live, observed: Arc<Observed>) -> Kernel {
        let mut actor = Actor::new(driver, Slot::Vacant(Vacancy::Quiet), observed);
        actor.adopt(live);
        actor.spawn()
    }

    /// Make `live` the kernel and publish it to observers.
    fn adopt(&mut self, live: D::Live) {
        self.observed.update(|s| {
            s.pid = Some(live.pid());
            s.execution_count = 0;
            live.id().clone_into(&mut s.id);
        });
        self.driver.adopted(&live);
        self.slot = Slot::Live(live);
    }

    /// Stop the live kernel (if any) and record why there is none.
    async fn vacate(&mut self, why: Vacancy) {
        if let Slot::Live(live) = std::mem::replace(&mut self.slot, Slot::Vacant(why)) {
            self.driver.stop(live).await;
        }
        self.unpublish();
    }

    fn unpublish(&self) {
        self.observed.update(|s| {
            s.pid = None;
            s.id.clear();
        });
    }

    async fn execute(
        &mut self,
        mut cell: Cell,
        control: &mut mpsc::UnboundedReceiver<Control>,
    ) -> Executed {
        let started = Instant::now();
        let mut info = KernelInfo {
            backend: self.driver.backend(),
            reused: !self.first,
            ..KernelInfo::default()
        };
        self.first = false;
        if cell.reset {
            self.vacate(Vacancy::Untold(StateChange::Reset)).await;
        }
        let opts = self.driver.options();
        let timeout = cell.timeout.or(opts.default_timeout);
        let (grace, max_payload) = (opts.interrupt_grace, opts.max_tool_payload);
        // A watched cell's displays wait for its earlier output (what
        // an unwatched cell never pays for).
        let ordered = cell.events.is_some() && self.driver.orders_displays();
        self.driver.begin(cell.events.take());
        // A fresh authority for every cell (one without tools refuses
        // calls with a reason), retired the moment it settles.
        let tool_set = cell.tools.take();
        let authority = tools::authority::install(
            self.driver.authority_slot(),
            Authority::new(
                tool_set.clone(),
                cell.allow.take(),
                cell.max_tool_calls.unwrap_or(DEFAULT_MAX_TOOL_CALLS),
            ),
        );
        let mut announce = cell.started.take();
        let mut retried = false;
        let (outcome, stop, mut output) = loop {
            if let Slot::Vacant(why) = &self.slot {
                why.describe_fresh(&mut info);
                match self.driver.start().await {
                    Ok(Start::Live(live)) => self.adopt(live),
                    Ok(Start::Fallback(f)) => {
                        let (result, why) = self
                            .driver
                            .fallback(f, &cell.code, timeout, info, started)
                            .await;
                        self.slot = Slot::Vacant(why);
                        return (Ok(result), None);
                    }
                    Err(e) => {
                        // The cell never ran: nothing may keep its event
                        // sink open (a caller reading events would wait
                        // forever).
                        self.driver.abandon_cell();
                        return (Err(e.into()), None);
                    }
                }
            }
            let Slot::Live(live) = &mut self.slot else {
                unreachable!("a live kernel was just ensured")
            };
            *live.count() += 1;
            let count = *live.count();
            info.id = live.id().to_owned();
            info.pid = Some(live.pid());
            info.execution_count = count;
            self.observed.update(|s| s.execution_count = count);
            if let Some(started) = announce.take() {
                let _ = started.send(count);
            }
            let run = CellRun {
                request: exec_frame(&cell.code, tool_set.as_ref(), live, max_payload, ordered),
                tools: tool_set.is_some(),
                authority: authority.authority(),
                timeout,
                control: &mut *control,
            };
            match self.driver.run(live, run).await {
                // Gone before the cell reached it: the cell never ran, so
                // run it in a fresh kernel (once).
                Ran::NotDelivered { vacancy, .. } if !retried => {
                    retried = true;
                    self.vacate(vacancy).await;
                }
                Ran::NotDelivered { again, .. } => break (again, None, D::Output::default()),
                Ran::Lost { detail, on } => {
                    return (Ok(self.lost(&detail, on, info, started).await), None)
                }
                Ran::Done(outcome, stop, output) => break (outcome, stop, output),
            }
        };
        // Settled: calls from now on (leftover threads) are refused, and
        // calls still in flight are cancelled.
        let tool_calls_made = authority.settle();
        let Slot::Live(live) = &mut self.slot else {
            unreachable!("the kernel is vacated only below")
        };
        let settled = self.driver.settle(live, &outcome, &mut output).await;
        if let Outcome::Reply(frame) = &outcome {
            if frame.int("tools_failed").is_some() {
                *live.tools_installed() = None; // sent again with the next cell
            }
            let dropped = frame.int("displays_dropped").unwrap_or(0);
            self.driver.displays().runner_dropped(
                u32::try_from(dropped).unwrap_or(u32::MAX),
                frame.text("displays_note"),
            );
        }
        let mut report = report::report(
            &outcome,
            stop,
            &mut info,
            grace,
            &settled.stderr_tail,
            settled.breach,
        );
        let shutdown = match outcome {
            Outcome::ShutDown(tx) => Some(tx),
            _ => None,
        };
        if let Some(v) = report.vacancy.take() {
            self.vacate(v).await;
        }
        let mut result = self.driver.finish(report, info, started, output).await;
        result.tool_calls_made = tool_calls_made;
        (Ok(result), shutdown)
    }

    /// The connection failed while the cell was out: it may have run, so
    /// it is never sent again; the kernel counts as dead (stopped later).
    async fn lost(
        &mut self,
        detail: &str,
        on: String,
        mut info: KernelInfo,
        started: Instant,
    ) -> CellResult {
        if let Slot::Live(live) = std::mem::replace(&mut self.slot, Slot::Vacant(Vacancy::Quiet)) {
            self.driver.abandon(live);
        }
        self.unpublish();
        let (report, why) = report::transport_lost(&mut info, detail, on);
        self.slot = Slot::Vacant(why);
        self.driver
            .finish(report, info, started, D::Output::default())
            .await
    }
}

/// Between cells: what the live kernel's driver sees (never resolves
/// without a kernel).
async fn idle<D: Driver>(driver: &mut D, slot: &mut Slot<D::Live>) -> Option<Vacancy> {
    match slot {
        Slot::Live(live) => driver.idle(live).await,
        Slot::Vacant(_) => std::future::pending().await,
    }
}

/// The runner's `exec` frame for `code`, with the `tools` module when the
/// kernel does not have this tool set yet, and `order` when its displays
/// must sync with its output.
fn exec_frame<L: LiveKernel>(
    code: &str,
    tools: Option<&ToolSet>,
    live: &mut L,
    max: usize,
    ordered: bool,
) -> Vec<u8> {
    let mut request = Frame::new()
        .with("op", "exec")
        .with("code", code.as_bytes());
    if ordered {
        request = request.with("order", "1");
    }
    if let Some(set) = tools {
        if !live.tools_installed().as_ref().is_some_and(|t| t.same(set)) {
            request = request
                .with("tools", set.module_source().as_bytes())
                .with("tools_max", max.to_string());
            if let Some(why) = live.tools_unavailable() {
                request = request.with("tools_error", why.as_bytes());
            }
            *live.tools_installed() = Some(set.clone());
        }
    }
    request.encode()
}

mod op;
mod snapshot;
#[cfg(test)]
mod tests;
