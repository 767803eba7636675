//! A turn of its own between cells that is not a cell: the host sends the
//! runner one request (a snapshot, a restore, a fork) and waits for its
//! reply. It runs through the driver as a cell does, so its output is
//! drained, a death is noticed and the kernel is vacated with the reason;
//! it is never counted as a cell and never changes what the next cell is
//! told about reuse.

use std::time::{Duration, Instant};

use cellhost_protocol::KernelInfo;
use tokio::sync::{mpsc, oneshot};

use super::{Actor, Slot};
use crate::kernel::driver::{CellRun, Driver, LiveKernel, Ran};
use crate::kernel::frame::Frame;
use crate::kernel::report::{self, Vacancy};
use crate::kernel::wait::{Outcome, Stop};
use crate::kernel::Control;
use crate::tools::{self, Authority};

/// How an op turn ended.
pub(super) enum Turned {
    /// The runner replied (or did not: `reply` is `None`, `gone` says
    /// why the kernel went).
    Ran {
        reply: Option<Frame>,
        timed_out: bool,
        gone: Option<String>,
        shutdown: Option<oneshot::Sender<()>>,
    },
    /// The request never reached a kernel, or the kernel could not be
    /// reached: why.
    Failed(String),
    /// No live kernel.
    NoKernel,
}

impl<D: Driver> Actor<D> {
    /// Send `request` to the live kernel and wait for its reply, at most
    /// `timeout` (then it is interrupted as a cell is). `after` runs as
    /// soon as the runner is done with the request, however it ended, and
    /// before the kernel is stopped or drained (a snapshot's pump is
    /// released there: nothing later may wait on it).
    pub(super) async fn op_turn<R>(
        &mut self,
        request: Vec<u8>,
        timeout: Duration,
        control: &mut mpsc::UnboundedReceiver<Control>,
        after: impl std::future::Future<Output = R>,
    ) -> (Turned, R) {
        let Slot::Live(live) = &mut self.slot else {
            return (Turned::NoKernel, after.await);
        };
        let started = Instant::now();
        let mut info = KernelInfo {
            backend: self.driver.backend(),
            id: live.id().to_owned(),
            pid: Some(live.pid()),
            ..KernelInfo::default()
        };
        let grace = self.driver.options().interrupt_grace;
        let authority =
            tools::authority::install(self.driver.authority_slot(), Authority::new(None, None, 0));
        self.driver.begin(None);
        let run = CellRun {
            request,
            tools: false,
            authority: authority.authority(),
            timeout: Some(timeout),
            control,
        };
        let ran = self.driver.run(live, run).await;
        authority.settle();
        let after = after.await;
        let (outcome, stop, mut output) = match ran {
            Ran::Done(outcome, stop, output) => (outcome, stop, output),
            Ran::NotDelivered { vacancy, .. } => {
                self.vacate(vacancy).await;
                let why = "it had died before the request was sent".into();
                return (Turned::Failed(why), after);
            }
            Ran::Lost { detail, .. } => return (Turned::Failed(detail), after),
        };
        let timed_out = matches!(stop, Some(Stop::Timeout(_)));
        let Slot::Live(live) = &mut self.slot else {
            unreachable!("the kernel is vacated only below")
        };
        let settled = self.driver.settle(live, &outcome, &mut output).await;
        let reply = match &outcome {
            Outcome::Reply(frame) => Some(frame.clone()),
            _ => None,
        };
        let mut rep = report::report(
            &outcome,
            stop,
            &mut info,
            grace,
            &settled.stderr_tail,
            settled.breach,
        );
        let gone = info.note.clone();
        let shutdown = match outcome {
            Outcome::ShutDown(tx) => Some(tx),
            _ => None,
        };
        if let Some(v) = rep.vacancy.take() {
            // No cell saw this turn (a snapshot, a fork): what ended the
            // kernel is told whole by the session's next cell.
            let v = match v {
                Vacancy::Told(change) => Vacancy::Untold(change),
                other => other,
            };
            self.vacate(v).await;
        }
        // Drains the driver's captures of this turn (nothing is shown).
        let _ = self.driver.finish(rep, info, started, output).await;
        let turned = Turned::Ran {
            reply,
            timed_out,
            gone,
            shutdown,
        };
        (turned, after)
    }
}

/// What an op turn answers its caller: the reply, or why there is none;
/// and the shutdown it ended in.
pub(super) fn answer(
    turned: Turned,
    timeout: Duration,
) -> (Result<Frame, String>, Option<oneshot::Sender<()>>) {
    match turned {
        Turned::Ran {
            timed_out: true,
            shutdown,
            ..
        } => (
            Err(format!("it did not answer within {} s", timeout.as_secs())),
            shutdown,
        ),
        Turned::Ran {
            reply: Some(frame),
            shutdown,
            ..
        } => (Ok(frame), shutdown),
        Turned::Ran { gone, shutdown, .. } => (
            Err(gone.unwrap_or_else(|| "the kernel stopped".into())),
            shutdown,
        ),
        Turned::Failed(why) => (Err(format!("the kernel is gone: {why}")), None),
        Turned::NoKernel => (Err("no kernel process runs".into()), None),
    }
}
