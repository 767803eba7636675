//! What a result says about a cell's end and the kernel's state.
//!
//! Every sentence a caller reads about state (kept, reset, lost, ended)
//! is written here, from how waiting for the cell ended ([`Outcome`]) or
//! why the previous process is gone ([`Vacancy`]).

use std::time::Duration;

use cellhost_protocol::{KernelInfo, Status};

use super::breach::Breach;
use super::process::Exit;
use super::wait::{Outcome, Stop};

/// Why there is no live process, and what the next cell must be told.
#[derive(Debug, Clone)]
pub(crate) enum Vacancy {
    /// Already reported by the cell that saw it (ended, died in a cell,
    /// killed after a timeout): the next cell only says it got a fresh
    /// kernel, and why. Empty: nothing to say (shutdown).
    Reported(String),
    /// Died while idle: nobody knows yet that the state is gone.
    DiedIdle(Exit),
    /// Wrote something other than a display on the control pipe while
    /// idle (a thread writing to fd 4), so it was killed.
    BrokeIdle(String),
    /// The caller asked for a reset.
    Reset,
    /// A remote runner found gone before a cell (`why`: "had exited
    /// before this cell (…)").
    RemoteGone(String),
}

impl Vacancy {
    /// Flags and note for the first cell of the fresh kernel that replaces
    /// the vacated one.
    pub(crate) fn describe_fresh(&self, info: &mut KernelInfo) {
        info.reused = false;
        match self {
            Vacancy::Reset => {
                info.state_reset = true;
                info.note = Some(
                    "The kernel was reset as asked: earlier state was discarded and this cell ran in a fresh kernel."
                        .into(),
                );
            }
            Vacancy::DiedIdle(exit) => {
                info.state_lost = true;
                info.note = Some(format!(
                    "The previous kernel {} while idle, so its state was lost; this cell ran in a fresh kernel.",
                    exit.describe()
                ));
            }
            Vacancy::BrokeIdle(detail) => {
                info.state_lost = true;
                info.note = Some(format!(
                    "The previous kernel broke its control channel while idle ({detail}), so it was killed and its state was lost; this cell ran in a fresh kernel."
                ));
            }
            Vacancy::RemoteGone(why) => {
                info.state_lost = true;
                info.note = Some(format!(
                    "The previous remote kernel {why}, so its state was lost; this cell ran in a fresh kernel."
                ));
            }
            Vacancy::Reported(why) if !why.is_empty() => {
                info.note = Some(format!("This cell ran in a fresh kernel: {why}"));
            }
            Vacancy::Reported(_) => {}
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
    let lost = |info: &mut KernelInfo, note: String, next: String| {
        info.state_lost = true;
        info.note = Some(note);
        Some(Vacancy::Reported(next))
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
                    info.ended = true;
                    info.note = Some(format!(
                        "The kernel ended: the cell called sys.exit({code}). Its state is gone; the next cell starts a fresh kernel."
                    ));
                    r.vacancy = Some(Vacancy::Reported(
                        "the previous kernel ended with sys.exit().".into(),
                    ));
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
                r.vacancy = lost(
                    info,
                    format!("The kernel was killed for exceeding its {limit}, so its state was lost; the next cell starts a fresh kernel."),
                    format!("the previous kernel was killed for exceeding its {limit}."),
                );
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
            r.vacancy = lost(
                info,
                format!("The kernel {how} during this cell, so its state was lost; the next cell starts a fresh kernel."),
                format!("the previous kernel {how} during a cell."),
            );
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
            r.vacancy = lost(
                info,
                "The kernel was killed because the cell did not stop when interrupted, so its state was lost; the next cell starts a fresh kernel.".into(),
                "the previous kernel was killed after an interrupt it ignored.".into(),
            );
        }
        Outcome::Broken(detail) => {
            r.status = Status::Error;
            r.error = Some(format!(
                "KernelProtocolError: {detail}; the kernel was killed"
            ));
            r.vacancy = lost(
                info,
                "The kernel broke its control channel and was killed, so its state was lost; the next cell starts a fresh kernel.".into(),
                "the previous kernel broke its control channel.".into(),
            );
        }
        Outcome::ShutDown(_) => {
            r.status = stopped_status;
            r.error = Some("KernelShutdown: the kernel was shut down during the cell".into());
            info.state_lost = true;
            info.note =
                Some("The kernel was shut down during this cell; its state is gone.".into());
        }
    }
    r
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
        let i = fresh(Vacancy::Reset);
        assert!(i.state_reset && !i.state_lost);
        assert_eq!(
            i.note.as_deref(),
            Some("The kernel was reset as asked: earlier state was discarded and this cell ran in a fresh kernel.")
        );
        let i = fresh(Vacancy::RemoteGone(
            "had exited before this cell (idle self-exit, container restart or crash)".into(),
        ));
        assert!(i.state_lost);
        assert_eq!(
            i.note.as_deref(),
            Some("The previous remote kernel had exited before this cell (idle self-exit, container restart or crash), so its state was lost; this cell ran in a fresh kernel.")
        );
        let i = fresh(Vacancy::Reported("it ended (sys.exit).".into()));
        assert!(!i.state_lost && !i.state_reset);
        assert_eq!(
            i.note.as_deref(),
            Some("This cell ran in a fresh kernel: it ended (sys.exit).")
        );
        assert_eq!(fresh(Vacancy::Reported(String::new())).note, None);
        let i = fresh(Vacancy::BrokeIdle("a stray frame".into()));
        assert!(i.state_lost);
        assert!(i.note.unwrap().starts_with(
            "The previous kernel broke its control channel while idle (a stray frame)"
        ));
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
        assert!(matches!(r.vacancy, Some(Vacancy::Reported(_))));
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
        Vacancy::DiedIdle(Exit::Signal(9)).describe_fresh(&mut info);
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
