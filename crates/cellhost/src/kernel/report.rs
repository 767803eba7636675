//! What a result says about a cell's end and the kernel's state.
//!
//! Every sentence a caller reads about state (kept, reset, lost, ended)
//! is written here, from how waiting for the cell ended ([`Outcome`]) or
//! why the previous process is gone ([`Vacancy`]).

use std::time::Duration;

use cellhost_protocol::{KernelInfo, Status};

use super::breach::Breach;
use super::wait::{Outcome, Stop};

/// A change of a kernel's state that a result tells its caller. Every
/// sentence about state (kept, reset, lost, ended) is rendered here, by
/// [`StateChange::note`], and put on a result by [`StateChange::tell`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateChange {
    /// The caller asked for a reset; told by the fresh kernel's first cell.
    Reset,
    /// The previous process died while idle (`how`: "was killed by
    /// SIGKILL"); told by the fresh kernel's first cell.
    DiedIdle {
        /// How it died, as `Exit::describe` words it.
        how: String,
    },
    /// The previous process wrote something other than a display on its
    /// control pipe while idle (a thread writing to fd 4), so it was
    /// killed; told by the fresh kernel's first cell.
    BrokeIdle {
        /// What was wrong with what it wrote.
        detail: String,
    },
    /// A remote runner was found gone before a cell (`why`: "had exited
    /// before this cell (…)"); told by the fresh kernel's first cell.
    RemoteGone {
        /// What was found.
        why: String,
    },
    /// The cell called `sys.exit(code)`.
    Ended {
        /// The exit code.
        code: i64,
    },
    /// The kernel was killed at a resource limit during the cell.
    KilledAtLimit {
        /// The limit, as the sandbox describes it ("memory limit 512 MiB").
        limit: String,
    },
    /// The kernel died during the cell (`how`: "was killed by SIGSEGV").
    DiedInCell {
        /// How it died.
        how: String,
    },
    /// The cell ignored its interrupt (or timeout) for the grace period,
    /// so the kernel was killed.
    KilledAfterInterrupt,
    /// The kernel broke its control channel during the cell and was killed.
    BrokeChannel,
    /// The kernel was shut down while the cell ran.
    ShutDown,
    /// The connection to a remote kernel failed during the cell.
    TransportLost {
        /// The transport, as it describes itself (`ssh root@host:22`).
        on: String,
    },
    /// A remote runner could not start, so the cell ran one-shot.
    CouldNotStart {
        /// Why it could not start.
        why: String,
    },
    /// Told by the fresh kernel's first cell when the change that took
    /// the previous one was already told by the cell that saw it.
    FreshAfter(Box<StateChange>),
    /// The session's previous kernel was evicted by the kernel cap.
    Evicted {
        /// The cap.
        max_kernels: usize,
    },
    /// The session's previous kernel was reaped after sitting idle.
    Reaped {
        /// The idle timeout.
        idle: Duration,
    },
    /// The session's kernels were disposed (reset or closed).
    Disposed,
    /// The daemon restarted since the session's last cell.
    DaemonRestarted,
    /// The session is a fork of `from` (its first kernel; see
    /// `registry/fork.rs`).
    Forked {
        /// The source session.
        from: String,
    },
    /// The session is a fork of `from` whose kernel is a copy of the
    /// source's process (`kernel/fork.rs`): the whole state, `names`
    /// globals.
    ProcessForked {
        /// The source session.
        from: String,
        /// Globals the copy holds.
        names: u64,
    },
    /// The session's previous kernel went (`why`: evicted, reaped, the
    /// daemon restarted) and its state was loaded from a snapshot into
    /// this fresh kernel (docs/snapshots.md). State counts as lost when
    /// globals were skipped or the snapshot is older than the state.
    Restored {
        /// Why the previous kernel went.
        why: Box<StateChange>,
        /// Globals restored.
        names: u64,
        /// Globals not restored: (name, type).
        skipped: Vec<(String, String)>,
        /// Seconds since the snapshot was taken, when it was taken while
        /// the kernel lived on (so later cells' state is lost).
        stale_age: Option<u64>,
    },
    /// The session's previous kernel went (`why`) and its snapshot could
    /// not be loaded (`reason`).
    RestoreFailed {
        /// Why the previous kernel went.
        why: Box<StateChange>,
        /// Why the snapshot could not be loaded.
        reason: String,
    },
}

/// Which of a result's state flags a change sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flag {
    Lost,
    Reset,
    Ended,
    None,
}

impl StateChange {
    fn flag(&self) -> Flag {
        match self {
            StateChange::Reset | StateChange::Disposed => Flag::Reset,
            StateChange::Ended { .. } => Flag::Ended,
            StateChange::CouldNotStart { .. }
            | StateChange::FreshAfter(_)
            | StateChange::ProcessForked { .. } => Flag::None,
            StateChange::Restored {
                skipped, stale_age, ..
            } if skipped.is_empty() && stale_age.is_none() => Flag::None,
            _ => Flag::Lost,
        }
    }

    /// The sentence a result carries in its note.
    pub fn note(&self) -> String {
        const NEXT_FRESH: &str = "the next cell starts a fresh kernel.";
        match self {
            StateChange::Reset => "The kernel was reset as asked: earlier state was discarded and this cell ran in a fresh kernel.".into(),
            StateChange::DiedIdle { how } => format!(
                "The previous kernel {how} while idle, so its state was lost; this cell ran in a fresh kernel."
            ),
            StateChange::BrokeIdle { detail } => format!(
                "The previous kernel broke its control channel while idle ({detail}), so it was killed and its state was lost; this cell ran in a fresh kernel."
            ),
            StateChange::RemoteGone { why } => format!(
                "The previous remote kernel {why}, so its state was lost; this cell ran in a fresh kernel."
            ),
            StateChange::Ended { code } => format!(
                "The kernel ended: the cell called sys.exit({code}). Its state is gone; {NEXT_FRESH}"
            ),
            StateChange::KilledAtLimit { limit } => format!(
                "The kernel was killed for exceeding its {limit}, so its state was lost; {NEXT_FRESH}"
            ),
            StateChange::DiedInCell { how } => format!(
                "The kernel {how} during this cell, so its state was lost; {NEXT_FRESH}"
            ),
            StateChange::KilledAfterInterrupt => format!(
                "The kernel was killed because the cell did not stop when interrupted, so its state was lost; {NEXT_FRESH}"
            ),
            StateChange::BrokeChannel => format!(
                "The kernel broke its control channel and was killed, so its state was lost; {NEXT_FRESH}"
            ),
            StateChange::ShutDown => "The kernel was shut down during this cell; its state is gone.".into(),
            StateChange::TransportLost { on } => format!(
                "The connection to the remote kernel on {on} failed during this cell, so the kernel counts as dead and its state is lost; {NEXT_FRESH}"
            ),
            StateChange::CouldNotStart { why } => format!(
                "The remote kernel could not start ({why}), so this cell ran one-shot in a fresh process: no state is kept between cells; the next cell tries to start a kernel again."
            ),
            StateChange::FreshAfter(before) => match before.since() {
                Some(since) => format!("This cell ran in a fresh kernel: {since}"),
                None => "This cell ran in a fresh kernel.".into(),
            },
            StateChange::Evicted { max_kernels } => format!(
                "State lost: this session's previous kernel was evicted to keep at most \
                 {max_kernels} kernels (least recently used first); this is a fresh kernel, \
                 so re-run setup cells."
            ),
            StateChange::Reaped { idle } => format!(
                "State lost: this session's previous kernel was stopped after {} s idle \
                 (idle_timeout); this is a fresh kernel, so re-run setup cells.",
                idle.as_secs()
            ),
            StateChange::Disposed => "State reset: this session's kernels were disposed (reset or closed); this is \
                 a fresh kernel."
                .into(),
            StateChange::DaemonRestarted => "State lost: the daemon restarted since this session's last cell, and its \
                    kernels with it; this is a fresh kernel, so re-run setup cells."
                .into(),
            StateChange::ProcessForked { from, names } => format!(
                "This session is a fork of {from}: its kernel is a copy of {from}'s process as it \
                 was at the fork (copy-on-write), with all of its state ({names} {}); the \
                 workspace files were copied. Nothing is shared with {from} from here on.",
                if *names == 1 { "name" } else { "names" }
            ),
            StateChange::Forked { from } => format!(
                "State lost: this session is a fork of {from}, but the copy of its state was not \
                 loaded; this is a fresh kernel (the workspace files were copied)."
            ),
            StateChange::Restored {
                why,
                names,
                skipped,
                stale_age,
            } => restored_note(why, *names, skipped, *stale_age),
            StateChange::RestoreFailed { why, reason } => format!(
                "{} Its snapshot could not be restored: {reason}.",
                why.note()
            ),
        }
    }

    /// What the next kernel's first cell says about this change, already
    /// told by the cell that saw it.
    fn since(&self) -> Option<String> {
        Some(match self {
            StateChange::Ended { .. } => "the previous kernel ended with sys.exit().".into(),
            StateChange::KilledAtLimit { limit } => {
                format!("the previous kernel was killed for exceeding its {limit}.")
            }
            StateChange::DiedInCell { how } => format!("the previous kernel {how} during a cell."),
            StateChange::KilledAfterInterrupt => {
                "the previous kernel was killed after an interrupt it ignored.".into()
            }
            StateChange::BrokeChannel => "the previous kernel broke its control channel.".into(),
            StateChange::TransportLost { .. } => {
                "the connection to the previous remote kernel failed during a cell.".into()
            }
            StateChange::CouldNotStart { why } => {
                format!("the remote runner could not start earlier ({why}).")
            }
            _ => return None,
        })
    }

    /// Put this change on a result: its flag, and its sentence before
    /// whatever the note says already (the older news first).
    pub fn tell(&self, info: &mut KernelInfo) {
        match self.flag() {
            Flag::Lost => info.state_lost = true,
            Flag::Reset => info.state_reset = true,
            Flag::Ended => info.ended = true,
            Flag::None => {}
        }
        add_note(info, self.note(), NoteAt::Start);
    }
}

/// The sentence of a restore: why the kernel went, what came back, what
/// did not.
fn restored_note(
    why: &StateChange,
    names: u64,
    skipped: &[(String, String)],
    stale_age: Option<u64>,
) -> String {
    let went = match why {
        StateChange::Evicted { max_kernels } => {
            format!("The kernel was evicted to keep at most {max_kernels} kernels")
        }
        StateChange::Reaped { idle } => {
            format!("The kernel was stopped after {} s idle", idle.as_secs())
        }
        StateChange::DaemonRestarted => {
            "The daemon restarted since this session's last cell".to_owned()
        }
        StateChange::Forked { from } => format!("This session is a fork of {from}"),
        _ => "The previous kernel went".to_owned(),
    };
    let plural = if names == 1 { "name" } else { "names" };
    let mut note = match stale_age {
        Some(age) => format!(
            "{went}; its state was restored from a snapshot taken {age} s ago ({names} {plural}), \
             so what later cells did is lost."
        ),
        None => format!("{went}; its state was restored from a snapshot ({names} {plural})."),
    };
    if !skipped.is_empty() {
        const SHOWN: usize = 10;
        let list: Vec<String> = skipped
            .iter()
            .take(SHOWN)
            .map(|(name, kind)| format!("{name} ({kind})"))
            .collect();
        note.push_str(" Not restored: ");
        note.push_str(&list.join(", "));
        if skipped.len() > SHOWN {
            note.push_str(&format!(" and {} more", skipped.len() - SHOWN));
        }
        note.push('.');
    }
    note
}

/// Where [`add_note`] puts a sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoteAt {
    /// Before what the note says (news older than the cell's own).
    Start,
    /// After it (news about the answer, such as the history row).
    End,
}

/// The one way to add a sentence to a result's note.
pub fn add_note(info: &mut KernelInfo, sentence: String, at: NoteAt) {
    info.note = Some(match info.note.take() {
        Some(n) if !n.is_empty() => match at {
            NoteAt::Start => format!("{sentence} {n}"),
            NoteAt::End => format!("{n} {sentence}"),
        },
        _ => sentence,
    });
}

/// Why there is no live process, and what the next cell must be told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Vacancy {
    /// Nothing to tell (shutdown, the first start).
    Quiet,
    /// Told by the cell that saw it (ended, died in a cell, killed after
    /// a timeout): the next cell only says it got a fresh kernel, and why.
    Told(StateChange),
    /// Nobody knows yet (died or broke while idle, a reset, a runner
    /// found gone): the next cell tells it whole.
    Untold(StateChange),
}

impl Vacancy {
    /// Flags and note for the first cell of the fresh kernel that replaces
    /// the vacated one (the latest vacancy is the one told).
    pub(crate) fn describe_fresh(&self, info: &mut KernelInfo) {
        info.reused = false;
        info.note = None;
        match self {
            Vacancy::Quiet => {}
            Vacancy::Untold(change) => change.tell(info),
            Vacancy::Told(change) => StateChange::FreshAfter(Box::new(change.clone())).tell(info),
        }
    }
}

/// The parts of a cell result decided by how the cell ended.
pub(crate) struct Report {
    pub status: Status,
    pub value: Option<String>,
    pub error: Option<String>,
    pub traceback: Option<String>,
    /// What to do about the error (the runner's `hint`).
    pub hint: Option<String>,
    /// The process is gone (or must go) after this cell, and why.
    pub vacancy: Option<Vacancy>,
}

/// Describe how the cell ended; sets `info`'s state flags and note.
/// `stderr_tail` is the end of the cell's stderr, quoted when the kernel
/// died; `breach` names the resource limit the cell ran into, if any.
pub(crate) fn report(
    outcome: &Outcome,
    stop: Option<Stop>,
    info: &mut KernelInfo,
    interrupt_grace: Duration,
    stderr_tail: &str,
    breach: Option<Breach>,
) -> Report {
    let mut r = Report {
        status: Status::Success,
        value: None,
        error: None,
        traceback: None,
        hint: None,
        vacancy: None,
    };
    let stopped_status = match stop {
        Some(Stop::Timeout(_)) => Status::Timeout,
        Some(Stop::Interrupt) => Status::Interrupted,
        None => Status::Error,
    };
    // A change in the cell supersedes what the fresh kernel's note said.
    let changed = |info: &mut KernelInfo, change: StateChange| {
        info.note = None;
        change.tell(info);
        Some(Vacancy::Told(change))
    };
    match outcome {
        Outcome::Reply(frame) => {
            r.value = frame.text("value");
            r.error = frame.text("error");
            r.traceback = frame.text("traceback");
            r.hint = frame.text("hint");
            match frame.text("status").as_deref() {
                Some("ok") => {}
                Some("error") => {
                    r.status = Status::Error;
                    if let Some(b) = breach {
                        let what = r.error.take().unwrap_or_else(|| "error".into());
                        r.error = Some(format!(
                            "{what} ({} exceeded; the kernel and its state were kept)",
                            b.limit.describe()
                        ));
                    }
                }
                Some("interrupted") => {
                    r.status = match stop {
                        Some(Stop::Timeout(t)) => {
                            r.error = Some(format!(
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
                        r.status = Status::Error;
                        r.error = r.error.take().or(Some(format!("SystemExit: {code}")));
                    }
                    r.vacancy = changed(info, StateChange::Ended { code });
                }
                other => {
                    r.status = Status::Error;
                    r.error = Some(format!(
                        "cellhost: the runner replied with an unknown status {other:?}"
                    ));
                }
            }
        }
        Outcome::Died(exit) | Outcome::NotDelivered(exit) => {
            r.status = stopped_status;
            let how = exit.describe();
            if let (Some(b), Outcome::Died(_)) = (breach, outcome) {
                let limit = b.limit.describe();
                r.error = Some(format!(
                    "LimitExceeded: killed: {limit} exceeded (the kernel process {how} during the cell)"
                ));
                r.vacancy = changed(info, StateChange::KilledAtLimit { limit });
                return r;
            }
            let last = stderr_tail
                .lines()
                .rev()
                .map(str::trim)
                .find(|l| !l.is_empty());
            r.error = Some(match last {
                None => format!("KernelDied: the kernel process {how} during the cell"),
                Some(last) => format!(
                    "KernelDied: the kernel process {how} during the cell; stderr ended with: {last}"
                ),
            });
            r.vacancy = changed(info, StateChange::DiedInCell { how });
        }
        Outcome::KilledAfterGrace => {
            r.status = stopped_status;
            let grace = human(interrupt_grace);
            r.error = Some(match stop {
                Some(Stop::Timeout(t)) => format!(
                    "Timeout: the cell ran longer than {} and did not stop within {grace} of the interrupt, so the kernel was killed",
                    human(t)
                ),
                _ => format!(
                    "Interrupted: the cell did not stop within {grace} of the interrupt, so the kernel was killed"
                ),
            });
            r.vacancy = changed(info, StateChange::KilledAfterInterrupt);
        }
        Outcome::Broken(detail) => {
            r.status = Status::Error;
            r.error = Some(format!(
                "KernelProtocolError: {detail}; the kernel was killed"
            ));
            r.vacancy = changed(info, StateChange::BrokeChannel);
        }
        Outcome::ShutDown(_) => {
            r.status = stopped_status;
            r.error = Some("KernelShutdown: the kernel was shut down during the cell".into());
            info.note = None;
            StateChange::ShutDown.tell(info);
        }
    }
    r
}

/// The connection to a remote kernel failed while its cell was out: the
/// cell may have run, so it is never sent again, and the kernel counts
/// as dead (`on`: the transport).
pub(crate) fn transport_lost(info: &mut KernelInfo, detail: &str, on: String) -> (Report, Vacancy) {
    let change = StateChange::TransportLost { on };
    info.note = None;
    change.tell(info);
    let report = Report {
        status: Status::Error,
        value: None,
        error: Some(format!(
            "TransportError: {detail}. The cell may or may not have run; it was not retried."
        )),
        traceback: None,
        hint: None,
        vacancy: None,
    };
    (report, Vacancy::Told(change))
}

/// `2s`, `1.5s`, `250ms`.
pub(crate) fn human(d: Duration) -> String {
    if d.as_millis().is_multiple_of(1000) {
        format!("{}s", d.as_secs())
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests;
