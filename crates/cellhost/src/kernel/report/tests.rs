//! What the sentences about a cell's end and the kernel's state say, pinned in
//! insta snapshots, plus the status and state each ending maps to.

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
            why: "had exited before this cell (idle self-exit, container restart or crash)".into(),
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
