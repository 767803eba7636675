//! What the session actor (`actor.rs`) needs from a kind of kernel: the
//! [`Driver`] trait.
//!
//! The actor owns the state machine every kernel shares: the request
//! loop, the live process or why there is none ([`Vacancy`]), reset,
//! retry-once of a cell that never reached its kernel, the cell's tool
//! authority, and what the result says. A driver owns how one kind of
//! kernel is started, given a cell, watched between cells and stopped:
//! `local.rs` (a process on this host: pipes, frames, displays, the
//! sandbox) and `crate::remote::kernel` (a runner reached by exec over a
//! transport). The split follows nextest's dispatcher and executor, and
//! watchexec's supervisor job, generic over the child it wraps.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellhost_protocol::{CellResult, KernelInfo};
use tokio::sync::mpsc;

use super::breach::Breach;
use super::display::{CellEvent, Displays};
use super::report::{Report, Vacancy};
use super::wait::{Outcome, Stop};
use super::{Control, KernelOptions, SpawnError};
use crate::tools::{Authority, AuthoritySlot, ToolSet};

/// A live kernel as the actor sees it.
pub(crate) trait LiveKernel: Send {
    /// Its id (`k-…`, `r-…`).
    fn id(&self) -> &str;
    /// Its pid as the host (or the remote side) sees it.
    fn pid(&self) -> u32;
    /// Cells it has been given.
    fn count(&mut self) -> &mut u64;
    /// The tool set whose `tools` module it has, if any.
    fn tools_installed(&mut self) -> &mut Option<ToolSet>;
    /// Why its tools cannot work (sent with the module), if they cannot.
    fn tools_unavailable(&self) -> Option<&str> {
        None
    }
}

/// What starting a kernel gave.
pub(crate) enum Start<L, F> {
    Live(L),
    /// No kernel, but cells can still run without state (`F` says how).
    Fallback(F),
}

/// How giving a cell to a live kernel ended.
pub(crate) enum Ran<O> {
    /// The cell ran (or was stopped); `O` is the driver's own output.
    Done(Outcome, Option<Stop>, O),
    /// The kernel was found gone before the cell reached it: the cell
    /// never ran. The actor vacates with `vacancy` and runs it once more
    /// in a fresh kernel; if that one is gone too, the cell ends `again`.
    NotDelivered { vacancy: Vacancy, again: Outcome },
    /// The connection to the kernel failed while the cell was out (it may
    /// have run, so it is never sent again); `on` names the transport.
    Lost { detail: String, on: String },
}

/// One cell, as the actor hands it to [`Driver::run`].
pub(crate) struct CellRun<'a> {
    /// The runner's `exec` frame, encoded.
    pub request: Vec<u8>,
    /// The cell has tools.
    pub tools: bool,
    /// Its authority over them, retired when the cell settles.
    pub authority: &'a Arc<Authority>,
    pub timeout: Option<Duration>,
    /// Interrupts and shutdown arriving while the cell runs.
    pub control: &'a mut mpsc::UnboundedReceiver<Control>,
}

/// What the driver found after the cell, for the report.
#[derive(Default)]
pub(crate) struct Settled {
    /// The end of the cell's stderr (quoted when the kernel died).
    pub stderr_tail: String,
    /// The resource limit the cell ran into, if any.
    pub breach: Option<Breach>,
}

/// One kind of kernel, driven by the session actor. Futures are `Send`:
/// the actor runs in its own task.
pub(crate) trait Driver: Send + 'static {
    type Live: LiveKernel;
    /// What a failed start leaves to run cells without state.
    type Fallback: Send;
    /// The driver's own output of a cell (the remote result blob).
    type Output: Default + Send;

    /// `local`, or the remote backend's name.
    fn backend(&self) -> String;
    /// Timeouts and limits.
    fn options(&self) -> &KernelOptions;
    /// Where the kernel's tool server looks up the running cell's
    /// authority (`None`: the driver serves calls itself, in `run`).
    fn authority_slot(&self) -> Option<&AuthoritySlot> {
        None
    }
    /// The running cell's displays.
    fn displays(&mut self) -> &mut Displays;
    /// Whether a watched cell's displays can reach its event sink in
    /// order with its stdout and stderr: the actor then asks the runner
    /// to sync before each display (`order` in the exec frame; see
    /// runner/frames.py `_order`). Only a driver that reads the sync and acks it
    /// may say yes: a runner left waiting for an ack hangs. Remote
    /// kernels do not (their events are not streamed in order).
    fn orders_displays(&self) -> bool {
        false
    }

    /// Where a snapshot FIFO for `live` goes: the host's path of a dir
    /// the kernel can open files in, and the same dir as the kernel sees
    /// it (`None`: this kind of kernel takes no snapshots).
    fn fifo_dir(&self, _live: &Self::Live) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
        None
    }

    /// With no FIFO: whether the runner keeps snapshots in files of its
    /// own host instead (a remote kernel: the stream never crosses the
    /// transport; the host names the file, the runner caps it).
    fn snapshot_files(&self) -> bool {
        false
    }

    /// Start a kernel.
    fn start(
        &mut self,
    ) -> impl Future<Output = Result<Start<Self::Live, Self::Fallback>, SpawnError>> + Send;
    /// `live` became the kernel (record it for crash recovery).
    fn adopted(&mut self, _live: &Self::Live) {}
    /// Stop a kernel that is no longer wanted.
    fn stop(&mut self, live: Self::Live) -> impl Future<Output = ()> + Send;
    /// Give up on a kernel that cannot be reached (stopped later).
    fn abandon(&mut self, _live: Self::Live) {}
    /// Between cells: resolves when the kernel must go, and why (`None`:
    /// nothing to do, ask again).
    fn idle(&mut self, _live: &mut Self::Live) -> impl Future<Output = Option<Vacancy>> + Send {
        std::future::pending()
    }
    /// A cell begins: its events go to `sink`.
    fn begin(&mut self, sink: Option<mpsc::UnboundedSender<CellEvent>>);
    /// The cell begun will not run (no kernel could start): release its
    /// event sink.
    fn abandon_cell(&mut self);
    /// Give `live` the cell and wait for it.
    fn run(
        &mut self,
        live: &mut Self::Live,
        cell: CellRun<'_>,
    ) -> impl Future<Output = Ran<Self::Output>> + Send;
    /// After the cell: collect what is left and say what the report needs.
    fn settle(
        &mut self,
        live: &mut Self::Live,
        outcome: &Outcome,
        output: &mut Self::Output,
    ) -> impl Future<Output = Settled> + Send;
    /// The cleaned, bounded result (a remote driver keeps cut output in
    /// the remote workspace on the way: hence async).
    fn finish(
        &mut self,
        report: Report,
        info: KernelInfo,
        started: Instant,
        output: Self::Output,
    ) -> impl Future<Output = CellResult> + Send;
    /// Run a cell without a kernel after a failed start; returns the
    /// result and what the next cell is told.
    fn fallback(
        &mut self,
        fallback: Self::Fallback,
        code: &str,
        timeout: Option<Duration>,
        info: KernelInfo,
        started: Instant,
    ) -> impl Future<Output = (CellResult, Vacancy)> + Send;
    /// The first start fell back: keep `fallback` for later and say what
    /// the first cell is told.
    fn park(&mut self, fallback: Self::Fallback) -> Vacancy;
    /// The kernel handle is gone (after the last kernel was stopped).
    fn teardown(&mut self) -> impl Future<Output = ()> + Send;
}
