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
pub(crate) struct Breach {
    pub limit: Limit,
    pub killed: bool,
}

/// The limit this cell ran into, judging by how it ended.
///
/// cgroup counters are read only when they can matter (a SIGKILL, an
/// `EAGAIN`): reading `memory.oom_control` costs ~85 µs, more than a
/// whole warm cell. They are compared with the values seen at the last
/// read (zero in a fresh cgroup).
pub(super) fn find(outcome: &Outcome, proc: &mut Process) -> Option<Breach> {
    let l = proc.limits;
    let pids_cgroup = proc.cgroup.as_ref().is_some_and(|c| c.limits_processes());
    let sigkill = Exit::Signal(Signal::SIGKILL as i32);
    let oom = match (&proc.cgroup, outcome) {
        // (A forked kernel's exit status is not ours to see: `Unknown`.)
        (Some(cg), Outcome::Died(exit)) if *exit == sigkill || *exit == Exit::Unknown => {
            let now = cg.oom_kills();
            let seen = std::mem::replace(&mut proc.counters.0, now);
            now > seen
        }
        _ => false,
    };
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
                Some("processes") => {
                    let refused = match &proc.cgroup {
                        Some(cg) if pids_cgroup => {
                            let now = cg.pids_max_hits();
                            let seen = std::mem::replace(&mut proc.counters.1, now);
                            now > seen
                        }
                        _ => true,
                    };
                    l.processes.filter(|_| refused)
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
