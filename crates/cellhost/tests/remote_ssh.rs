//! Remote kernels over a real OpenSSH server on 127.0.0.1 (started by
//! scripts/test): hermes-agent's remote-kernel tests, ported.

mod common;

use std::time::Duration;

use cellhost::{Cell, Status};
use common::remote::{alive_via, env, remote_manager, ssh, ssh_sh, SHORT};

fn on_host(s: &str) -> String {
    ssh_sh(&env("CELLHOST_TEST_SSH_HOST"), s)
}

#[tokio::test]
async fn the_first_call_spawns_and_the_second_reuses_its_state() {
    let m = remote_manager("box", ssh(), |o| o).await;
    let a = m
        .run(
            "s1",
            "x = 41\nprint('hi'); import sys; print('oops', file=sys.stderr)",
        )
        .await;
    assert_eq!(a.status, Status::Success, "{a:?}");
    assert_eq!(a.stdout, "hi\n");
    assert_eq!(a.stderr, "oops\n");
    assert_eq!(a.kernel.backend, "box");
    assert!(!a.kernel.reused && !a.kernel.state_lost);
    let b = m.run("s1", "x + 1").await;
    assert_eq!(b.value.as_deref(), Some("42"), "{b:?}");
    assert!(b.kernel.reused);
    assert_eq!(b.kernel.pid, a.kernel.pid);
    assert_eq!(b.kernel.execution_count, 2);
    let c = m.run("s1", "1/0").await;
    assert_eq!(c.status, Status::Error);
    assert_eq!(
        c.error.as_deref(),
        Some("ZeroDivisionError: division by zero")
    );
    assert!(c.traceback.unwrap().contains("<cell-3>"));
    let pid = b.kernel.pid.unwrap();
    assert!(alive_via(on_host, pid));
    m.manager.shutdown().await;
    assert!(!alive_via(on_host, pid), "shutdown kills the remote runner");
}

fn with_ssh(f: impl FnOnce(&mut cellhost::config::SshConfig)) -> cellhost::config::BackendConfig {
    let cellhost::config::BackendConfig::Ssh(mut c) = ssh() else {
        unreachable!()
    };
    f(&mut c);
    cellhost::config::BackendConfig::Ssh(c)
}

#[tokio::test]
async fn reset_kills_the_runner_and_respawns() {
    let m = remote_manager("box", ssh(), |o| o).await;
    let a = m.run("s", "x = 1").await;
    let old = a.kernel.pid.unwrap();
    let b = m
        .manager
        .execute("s", Cell::new("'x' in globals()").reset(true))
        .await
        .unwrap();
    assert_eq!(b.value.as_deref(), Some("False"));
    assert!(b.kernel.state_reset && !b.kernel.reused, "{:?}", b.kernel);
    assert_ne!(b.kernel.pid, Some(old));
    assert!(!alive_via(on_host, old), "the old runner is gone");
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_cell_timeout_interrupts_and_keeps_state() {
    let m = remote_manager("box", ssh(), |o| o).await;
    m.run("s", "x = 7").await;
    let cell = Cell::new("import time\nfor i in range(100): time.sleep(0.05)").timeout(SHORT);
    let r = m.manager.execute("s", cell).await.unwrap();
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert!(r.error.unwrap().contains("interrupted"), "state kept");
    assert!(!r.kernel.state_lost);
    let r = m.run("s", "x").await;
    assert_eq!(r.value.as_deref(), Some("7"));
    assert!(r.kernel.reused);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_timed_out_remote_cells_traceback_shows_only_user_frames() {
    let m = remote_manager("box", ssh(), |o| o).await;
    let code =
        "import time\ndef wait():\n    for i in range(100):\n        time.sleep(0.05)\nwait()";
    let r = m
        .manager
        .execute("s", Cell::new(code).timeout(SHORT))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    let tb = r.traceback.unwrap();
    assert!(tb.contains("<cell-1>") && tb.contains("in wait"), "{tb}");
    assert!(
        !tb.contains("runner.py") && !tb.contains("_on_sigint") && !tb.contains("cellhost-k."),
        "runner frames or the kernel dir in the traceback:\n{tb}"
    );
    assert!(tb.trim_end().ends_with("KeyboardInterrupt"), "{tb}");
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_cell_that_ignores_the_interrupt_is_killed_and_the_loss_reported() {
    let m = remote_manager("box", ssh(), |o| {
        let k = o.kernel.clone().interrupt_grace(Duration::from_millis(300));
        o.kernel(k)
    })
    .await;
    m.run("s", "x = 7").await;
    let code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.05)";
    let r = m
        .manager
        .execute("s", Cell::new(code).timeout(SHORT))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert!(r.error.unwrap().contains("killed"));
    assert!(r.kernel.state_lost);
    let pid = r.kernel.pid.unwrap();
    assert!(
        !alive_via(on_host, pid),
        "the runner's process group was killed"
    );
    let r = m.run("s", "'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(!r.kernel.reused);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_dead_kernel_is_reported_and_respawned() {
    let m = remote_manager("box", ssh(), |o| o).await;
    let pid = m.run("s", "x = 1").await.kernel.pid.unwrap();
    on_host(&format!("kill -9 {pid}"));
    let r = m.run("s", "'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"), "{r:?}");
    assert!(r.kernel.state_lost, "{:?}", r.kernel);
    assert!(r.kernel.note.unwrap().contains("state was lost"));
    assert_ne!(r.kernel.pid, Some(pid));
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_kernel_that_dies_during_a_cell_reports_it_with_its_stderr() {
    let m = remote_manager("box", ssh(), |o| o).await;
    let r = m
        .run("s", "import os, sys\nprint('last words', file=sys.stderr, flush=True)\nos.kill(os.getpid(), 9)")
        .await;
    assert_eq!(r.status, Status::Error);
    let e = r.error.unwrap();
    assert!(
        e.starts_with("KernelDied") && e.contains("last words"),
        "{e}"
    );
    assert!(r.kernel.state_lost);
    assert_eq!(m.run("s", "1").await.value.as_deref(), Some("1"));
    m.manager.shutdown().await;
}

#[tokio::test]
async fn an_idle_runner_exits_by_itself_and_the_next_cell_says_so() {
    let m = remote_manager("box", with_ssh(|c| c.idle_exit_seconds = Some(1)), |o| o).await;
    let pid = m.run("s", "x = 1").await.kernel.pid.unwrap();
    let gone =
        common::registry::eventually(Duration::from_secs(10), || !alive_via(on_host, pid)).await;
    assert!(gone, "the runner exits after idle_exit_seconds");
    let r = m.run("s", "'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(r.kernel.state_lost);
    assert!(r.kernel.note.unwrap().contains("idle"), "the note says why");
    m.manager.shutdown().await;
}

#[tokio::test]
async fn the_token_is_never_in_a_command_line_and_the_kernel_dir_is_private() {
    let m = remote_manager("box", ssh(), |o| o).await;
    let r = m
        .run("s", "import sys, os\nt = sys.modules['runner']._rpc_token\nd = os.path.dirname(sys.modules['runner'].__file__)\n(t, d)")
        .await;
    let v = r.value.unwrap();
    let (token, dir) = v
        .trim_matches(|c| c == '(' || c == ')')
        .split_once(", ")
        .map(|(a, b)| (a.trim_matches('\''), b.trim_matches('\'')))
        .unwrap();
    assert_eq!(token.len(), 64, "{v}");
    // While a cell runs, every process on the remote host and here.
    let running = tokio::spawn({
        let m = m.manager.clone();
        async move {
            m.execute("s", Cell::new("import time; time.sleep(1.5)"))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let remote = on_host("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '");
    assert!(
        remote.contains("remote.py serve"),
        "the scan sees the runner"
    );
    assert!(!remote.contains(token), "token in a remote command line");
    let mut local = String::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            local.push_str(&String::from_utf8_lossy(&c));
        }
    }
    assert!(!local.contains(token), "token in a local command line");
    let modes = on_host(&format!("stat -c '%a %n' {dir} {dir}/*"));
    assert!(modes.starts_with("700 "), "{modes}");
    for line in modes.lines().skip(1) {
        assert!(line.starts_with("600 "), "{line}");
    }
    assert!(
        !modes.contains("/env"),
        "the env file is read once and removed"
    );
    running.await.unwrap().unwrap();
    m.manager.shutdown().await;
    assert_eq!(
        on_host(&format!("test -e {dir} && echo left")),
        "",
        "dir removed"
    );
}

#[tokio::test]
async fn a_failed_ship_fails_closed() {
    let m = remote_manager(
        "box",
        with_ssh(|c| c.tmpdir = Some("/nonexistent/cellhost".into())),
        |o| o,
    )
    .await;
    let e = cellhost::error_chain(&m.manager.execute("s", Cell::new("1")).await.unwrap_err());
    // The session's workspace is made under the tmpdir before the ship.
    assert!(
        (e.contains("could not ship") || e.contains("could not make the session's workspace"))
            && e.contains("tmpdir"),
        "{e}"
    );
    assert!(m.manager.list().is_empty(), "no kernel is kept");
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_failed_spawn_fails_open_to_one_shot_cells() {
    let m = remote_manager(
        "box",
        with_ssh(|c| c.spawn_timeout_seconds = Some(0.0)),
        |o| o,
    )
    .await;
    let r = m
        .run(
            "s",
            "import os, sys; x = 5; print(x)\nos.path.dirname(sys.modules['runner'].__file__)",
        )
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.stdout, "5\n");
    let dir = r.value.unwrap().trim_matches('\'').to_owned();
    assert!(dir.contains("cellhost-k."), "{dir}");
    assert_eq!(
        on_host(&format!("test -e {dir} && echo left")),
        "",
        "the one-shot's dir is removed"
    );
    assert!(r.kernel.note.as_deref().unwrap().contains("one-shot"));
    let r = m.run("s", "x").await;
    assert_eq!(r.status, Status::Error, "one-shot cells keep no state");
    assert!(r.error.unwrap().contains("NameError"));
    m.manager.shutdown().await;
}

#[tokio::test]
async fn remote_output_goes_through_the_same_pipeline() {
    let m = remote_manager("box", ssh(), |o| o).await;
    let r = m
        .run("s", "print('x' * 200_000)\nprint('key sk-' + 'a' * 30)")
        .await;
    assert!(
        r.truncated.stdout && r.truncated.spill_path.is_some(),
        "{:?}",
        r.truncated
    );
    assert!(r.stdout.contains("[REDACTED"), "redacted");
    let r = m
        .run(
            "s",
            "import os\nprint('first')\nos.system('echo from-a-child')\nprint('\\x1b[31mred\\x1b[0m')",
        )
        .await;
    assert_eq!(
        r.stdout, "first\nfrom-a-child\nred\n",
        "fd-level capture in order, ANSI stripped"
    );
    let r = m
        .run(
            "s",
            "class H:\n    def _repr_html_(self): return '<b>hi</b>'\nH()",
        )
        .await;
    assert!(
        r.displays
            .iter()
            .any(|d| d.mime == "text/html" && d.data == "<b>hi</b>"),
        "{r:?}"
    );
    let r = m.run("s", "import sys; sys.exit(3)").await;
    assert!(r.kernel.ended);
    let r = m.run("s", "1").await;
    assert!(!r.kernel.reused);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_remote_flood_counts_the_bytes_the_remote_side_cut_too() {
    let m = remote_manager("box", ssh(), |o| o).await;
    let r = m
        .run(
            "s",
            "import sys\nsys.stdout.buffer.write(b'x' * 12_000_011)\nsys.stdout.flush()",
        )
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.truncated.stdout);
    let marker = r.stdout.lines().find(|l| l.starts_with("[...")).unwrap();
    assert!(
        marker.starts_with("[... 11,950,011 bytes cut"),
        "12,000,011 written, 50,000 kept: {marker}"
    );
    m.manager.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_host_fails_closed_with_what_to_check() {
    let m = remote_manager("box", with_ssh(|c| c.port = Some(1)), |o| o).await;
    let e = cellhost::error_chain(&m.manager.execute("s", Cell::new("1")).await.unwrap_err());
    assert!(
        e.contains("backend \"box\"") && e.contains("cannot connect") && e.contains("check host"),
        "{e}"
    );
    assert!(m.manager.list().is_empty());
    m.manager.shutdown().await;
}

#[tokio::test]
async fn displays_over_the_remote_result_cap_are_dropped_whole_never_cut() {
    let m = remote_manager("box", ssh(), |o| o).await;
    m.run("s", "x = 7").await;
    // Three 4 MB displays: over the 8 MiB the remote side returns. Cutting
    // the frames file by bytes broke the last frame (a protocol error
    // that killed the kernel).
    let r = m
        .run(
            "s",
            "class Big:\n    def __init__(s, c): s.c = c\n    def _repr_html_(s): return s.c * 4_000_000\n\
             for c in 'abc': display(Big(c))\nx",
        )
        .await;
    assert_eq!(r.status, Status::Success, "{:?} {:?}", r.error, r.kernel);
    assert_eq!(r.value.as_deref(), Some("7"));
    assert!(r.truncated.displays_dropped >= 1, "{:?}", r.truncated);
    let r = m.run("s", "x").await;
    assert!(r.kernel.reused && !r.kernel.state_lost, "{:?}", r.kernel);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn one_managers_shutdown_leaves_another_managers_cells_alone() {
    // Two managers sharing a runtime dir (as two daemons under the same
    // default one would): the ssh control socket was shared, and the
    // first one's shutdown (`-O exit`) cut the second one's running cell.
    let dir = tempfile::tempdir().unwrap();
    let start = |data: &str| {
        cellhost::registry::KernelManager::start(
            cellhost::registry::ManagerOptions::new(dir.path().join(data))
                .kernel(cellhost::KernelOptions::default().runtime_dir(dir.path().join("run")))
                .warm_pool(0)
                .idle_timeout(None)
                .backend("box", ssh())
                .default_backend("box"),
        )
    };
    let a = start("a").await;
    let b = start("b").await;
    assert_eq!(
        a.execute("s", Cell::new("1")).await.unwrap().status,
        Status::Success
    );
    assert_eq!(
        b.execute("s", Cell::new("x = 2")).await.unwrap().status,
        Status::Success
    );
    let cell = tokio::spawn({
        let b = b.clone();
        async move {
            b.execute("s", Cell::new("import time; time.sleep(2); x"))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    a.shutdown().await;
    let r = cell.await.unwrap().unwrap();
    assert_eq!(
        r.status,
        Status::Success,
        "{:?} {:?}",
        r.error,
        r.kernel.note
    );
    assert_eq!(r.value.as_deref(), Some("2"));
    b.shutdown().await;
}
