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
            StateChange::CouldNotStart { .. } | StateChange::FreshAfter(_) => Flag::None,
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
mod tests {
    use super::*;
    use crate::kernel::frame::Frame;
    use crate::kernel::process::Exit;

    fn fresh(v: Vacancy) -> KernelInfo {
        let mut info = KernelInfo {
            reused: true,
            ..KernelInfo::default()
        };
        v.describe_fresh(&mut info);
        assert!(!info.reused);
        info
    }

    #[test]
    fn the_fresh_kernel_sentences_of_both_backends() {
        let i = fresh(Vacancy::Untold(StateChange::Reset));
        assert!(i.state_reset && !i.state_lost);
        let i = fresh(Vacancy::Untold(StateChange::RemoteGone {
            why: "had exited before this cell (idle self-exit, container restart or crash)".into(),
        }));
        assert!(i.state_lost);
        let i = fresh(Vacancy::Told(StateChange::Ended { code: 0 }));
        assert!(!i.state_lost && !i.state_reset && !i.ended);
        assert_eq!(
            i.note.as_deref(),
            Some("This cell ran in a fresh kernel: the previous kernel ended with sys.exit().")
        );
        assert_eq!(fresh(Vacancy::Quiet).note, None);
        let i = fresh(Vacancy::Untold(StateChange::BrokeIdle {
            detail: "a stray frame".into(),
        }));
        assert!(i.state_lost);
    }

    /// Every state sentence, with the flags it sets, one line each.
    fn render(change: &StateChange) -> String {
        let mut info = KernelInfo::default();
        change.tell(&mut info);
        let flags = [
            (info.state_lost, "lost"),
            (info.state_reset, "reset"),
            (info.ended, "ended"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| *name)
        .collect::<Vec<_>>()
        .join(",");
        format!(
            "{change:?}\n  [{flags}] {}\n",
            info.note.unwrap_or_default()
        )
    }

    fn every_change() -> Vec<StateChange> {
        let told = [
            StateChange::Ended { code: 3 },
            StateChange::KilledAtLimit {
                limit: "memory limit 512 MiB".into(),
            },
            StateChange::DiedInCell {
                how: "was killed by SIGSEGV".into(),
            },
            StateChange::KilledAfterInterrupt,
            StateChange::BrokeChannel,
            StateChange::TransportLost {
                on: "ssh root@127.0.0.1:2299".into(),
            },
            StateChange::CouldNotStart {
                why: "python3: not found".into(),
            },
        ];
        let mut all = vec![
            StateChange::Reset,
            StateChange::DiedIdle {
                how: "was killed by SIGKILL".into(),
            },
            StateChange::BrokeIdle {
                detail: "a reply nobody asked for".into(),
            },
            StateChange::RemoteGone {
                why: "had exited before this cell (idle self-exit, container restart or crash)"
                    .into(),
            },
            StateChange::ShutDown,
            StateChange::Evicted { max_kernels: 8 },
            StateChange::Reaped {
                idle: Duration::from_secs(600),
            },
            StateChange::Disposed,
            StateChange::DaemonRestarted,
        ];
        for t in told {
            all.push(StateChange::FreshAfter(Box::new(t.clone())));
            all.push(t);
        }
        all
    }

    #[test]
    fn every_state_sentence() {
        let text: String = every_change().iter().map(render).collect();
        insta::assert_snapshot!("state_sentences", text);
    }

    #[test]
    fn notes_from_the_registry_and_the_history_go_around_the_cells() {
        let mut info = KernelInfo::default();
        fresh_into(&mut info, Vacancy::Untold(StateChange::Reset));
        StateChange::Evicted { max_kernels: 2 }.tell(&mut info);
        add_note(&mut info, "History: not recorded.".into(), NoteAt::End);
        insta::assert_snapshot!(info.note.unwrap(), @"State lost: this session's previous kernel was evicted to keep at most 2 kernels (least recently used first); this is a fresh kernel, so re-run setup cells. The kernel was reset as asked: earlier state was discarded and this cell ran in a fresh kernel. History: not recorded.");
        assert!(info.state_lost && info.state_reset);
    }

    fn fresh_into(info: &mut KernelInfo, v: Vacancy) {
        v.describe_fresh(info);
    }

    /// Every way a cell can end, as the result tells it.
    #[test]
    fn every_cell_ending() {
        let reply = |pairs: &[(&str, &str)]| {
            let mut f = Frame::new();
            for (k, v) in pairs {
                f = f.with(k, *v);
            }
            Outcome::Reply(f)
        };
        let t = Some(Stop::Timeout(Duration::from_millis(1500)));
        let i = Some(Stop::Interrupt);
        let cases: Vec<(&str, Outcome, Option<Stop>)> = vec![
            ("ok", reply(&[("status", "ok"), ("value", "82")]), None),
            (
                "error",
                reply(&[
                    ("status", "error"),
                    ("error", "ZeroDivisionError: division by zero"),
                ]),
                None,
            ),
            (
                "interrupted-kept",
                reply(&[("status", "interrupted"), ("error", "KeyboardInterrupt")]),
                i,
            ),
            (
                "timeout-kept",
                reply(&[("status", "interrupted"), ("error", "KeyboardInterrupt")]),
                t,
            ),
            (
                "exit-0",
                reply(&[("status", "exit"), ("exit_code", "0")]),
                None,
            ),
            (
                "exit-3",
                reply(&[("status", "exit"), ("exit_code", "3")]),
                None,
            ),
            ("unknown-status", reply(&[("status", "weird")]), None),
            ("died", Outcome::Died(Exit::Signal(11)), None),
            ("died-in-timeout", Outcome::Died(Exit::Code(1)), t),
            (
                "not-delivered-twice",
                Outcome::NotDelivered(Exit::Signal(9)),
                None,
            ),
            ("interrupt-killed", Outcome::KilledAfterGrace, i),
            ("timeout-killed", Outcome::KilledAfterGrace, t),
            ("broken", Outcome::Broken("bad control frame".into()), None),
            (
                "shut-down",
                Outcome::ShutDown(tokio::sync::oneshot::channel().0),
                None,
            ),
        ];
        let mut text = String::new();
        for (name, outcome, stop) in cases {
            let (r, info) = run(outcome, stop);
            text += &format!(
                "{name}: {:?}\n  error: {}\n  note: {}\n  next: {}\n",
                r.status,
                r.error.unwrap_or_default(),
                info.note.unwrap_or_default(),
                r.vacancy
                    .map(|v| fresh(v).note.unwrap_or_default())
                    .unwrap_or_default(),
            );
        }
        let mut info = KernelInfo::default();
        let (r, v) = transport_lost(&mut info, "connection refused", "ssh root@h:22".into());
        text += &format!(
            "transport-lost: {:?}\n  error: {}\n  note: {}\n  next: {}\n",
            r.status,
            r.error.unwrap_or_default(),
            info.note.unwrap_or_default(),
            fresh(v).note.unwrap_or_default(),
        );
        insta::assert_snapshot!("cell_endings", text);
    }

    fn run(outcome: Outcome, stop: Option<Stop>) -> (Report, KernelInfo) {
        let mut info = KernelInfo::default();
        let r = report(
            &outcome,
            stop,
            &mut info,
            Duration::from_secs(2),
            "boom\n\n",
            None,
        );
        (r, info)
    }

    #[test]
    fn a_death_at_a_limit_names_the_limit_and_loses_state() {
        let mut info = KernelInfo::default();
        let breach = Breach {
            limit: crate::sandbox::Limit::Memory {
                bytes: 512 << 20,
                cgroup: true,
            },
            killed: true,
        };
        let r = report(
            &Outcome::Died(Exit::Signal(9)),
            None,
            &mut info,
            Duration::from_secs(2),
            "",
            Some(breach),
        );
        let e = r.error.unwrap();
        assert!(e.contains("killed: memory limit 512 MiB exceeded"), "{e}");
        assert!(info.state_lost && info.note.unwrap().contains("512 MiB"));
    }

    #[test]
    fn an_exception_at_a_limit_names_it_and_keeps_state() {
        let mut info = KernelInfo::default();
        let f = Frame::new()
            .with("status", "error")
            .with("error", "OSError: [Errno 27] File too large");
        let breach = Breach {
            limit: crate::sandbox::Limit::FileSize { bytes: 10 << 20 },
            killed: false,
        };
        let r = report(
            &Outcome::Reply(f),
            None,
            &mut info,
            Duration::from_secs(2),
            "",
            Some(breach),
        );
        let e = r.error.unwrap();
        assert!(
            e.contains("File too large (file size limit 10 MiB exceeded"),
            "{e}"
        );
        assert!(!info.state_lost);
    }

    #[test]
    fn an_interrupted_reply_after_a_timeout_is_a_timeout_with_state_kept() {
        let f = Frame::new()
            .with("status", "interrupted")
            .with("error", "KeyboardInterrupt");
        let (r, info) = run(
            Outcome::Reply(f),
            Some(Stop::Timeout(Duration::from_millis(1500))),
        );
        assert_eq!(r.status, Status::Timeout);
        assert!(r.error.unwrap().contains("longer than 1.5s"));
        assert!(!info.state_lost && info.note.is_none() && r.vacancy.is_none());
    }

    #[test]
    fn a_death_quotes_the_last_stderr_line_and_loses_state() {
        let (r, info) = run(Outcome::Died(Exit::Signal(11)), None);
        assert_eq!(r.status, Status::Error);
        let e = r.error.unwrap();
        assert!(
            e.contains("SIGSEGV") && e.ends_with("stderr ended with: boom"),
            "{e}"
        );
        assert!(info.state_lost);
        assert!(matches!(r.vacancy, Some(Vacancy::Told(_))));
    }

    #[test]
    fn a_kill_after_the_grace_keeps_the_stop_reason_as_status() {
        let (r, info) = run(Outcome::KilledAfterGrace, Some(Stop::Interrupt));
        assert_eq!(r.status, Status::Interrupted);
        assert!(r.error.unwrap().contains("within 2s"));
        assert!(info.state_lost);
    }

    #[test]
    fn sys_exit_zero_is_success_and_ends_the_kernel() {
        let f = Frame::new().with("status", "exit").with("exit_code", "0");
        let (r, info) = run(Outcome::Reply(f), None);
        assert_eq!(r.status, Status::Success);
        assert!(info.ended && !info.state_lost);
        assert!(r.vacancy.is_some());
    }

    #[test]
    fn a_fresh_kernel_after_an_idle_death_reports_the_loss() {
        let mut info = KernelInfo {
            reused: true,
            ..KernelInfo::default()
        };
        Vacancy::Untold(StateChange::DiedIdle {
            how: Exit::Signal(9).describe(),
        })
        .describe_fresh(&mut info);
        assert!(info.state_lost && !info.reused);
        assert!(info.note.unwrap().contains("SIGKILL"));
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(human(Duration::from_secs(2)), "2s");
        assert_eq!(human(Duration::from_millis(250)), "250ms");
        assert_eq!(human(Duration::from_millis(1500)), "1.5s");
    }
}
