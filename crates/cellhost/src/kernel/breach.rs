//! Which resource limit, if any, a cell ran into.
//!
//! Evidence comes from three places: the runner's tag on an exception it
//! recognises (`MemoryError`, `EFBIG`, `EMFILE`, `EAGAIN` from a refused
//! fork), how the kernel died (SIGXCPU, SIGXFSZ), and the kernel's cgroup
//! counters (OOM kills, forks refused at `pids.max`) since the cell
//! started. The sentences themselves are written in `report.rs`.

use nix::sys::signal::Signal;

use super::process::{Exit, Process};
use super::wait::Outcome;
use crate::sandbox::Limit;

/// A limit the cell hit; `killed`: the kernel died of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Breach {
    pub limit: Limit,
    pub killed: bool,
}

/// Remember the cgroup counters as the cell starts.
pub(super) fn mark_start(proc: &mut Process) {
    if let Some(cg) = &proc.cgroup {
        proc.counters = (cg.oom_kills(), cg.pids_max_hits());
    }
}

/// The limit this cell ran into, judging by how it ended.
pub(super) fn find(outcome: &Outcome, proc: &Process) -> Option<Breach> {
    let l = &proc.limits;
    let (oom, forks_refused) = match &proc.cgroup {
        Some(cg) => (
            cg.oom_kills() > proc.counters.0,
            cg.pids_max_hits() > proc.counters.1,
        ),
        None => (false, false),
    };
    let pids_cgroup = proc.cgroup.as_ref().is_some_and(|c| c.limits_processes());
    match outcome {
        Outcome::Died(exit) => {
            let limit = match exit {
                _ if oom => l.memory,
                Exit::Signal(s) if *s == Signal::SIGXCPU as i32 => l.cpu,
                Exit::Signal(s) if *s == Signal::SIGXFSZ as i32 => l.file_size,
                _ => None,
            };
            limit.map(|limit| Breach {
                limit,
                killed: true,
            })
        }
        Outcome::Reply(frame) => {
            let limit = match frame.text("breach").as_deref() {
                Some("memory") => l.memory,
                Some("file_size") => l.file_size,
                Some("open_files") => l.open_files,
                // EAGAIN is a refused fork only when the cgroup says so
                // (or no cgroup counts forks and RLIMIT_NPROC is in force).
                Some("processes") if forks_refused || !pids_cgroup => l.processes,
                _ if forks_refused && frame.text("status").as_deref() == Some("error") => {
                    l.processes
                }
                _ => None,
            };
            limit.map(|limit| Breach {
                limit,
                killed: false,
            })
        }
        _ => None,
    }
}
