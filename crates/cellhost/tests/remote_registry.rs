//! The registry's rules hold for remote kernels too (real sshd, started by
//! scripts/test): tool sets, children, disposal, idle reaping, LRU
//! eviction that skips busy kernels, per-request backends, and placement
//! on a fleet of two hosts.

mod common;

use std::time::Duration;

use cellhost::registry::{child_owner, KernelSpec};
use cellhost::{Cell, KernelState, Status};
use common::registry::eventually;
use common::remote::{alive_via, env, fleet, remote_manager, run_spec, ssh, ssh_sh};

fn on_host(s: &str) -> String {
    ssh_sh(&env("CELLHOST_TEST_SSH_HOST"), s)
}

#[tokio::test]
async fn a_changed_tool_set_spawns_a_fresh_remote_kernel() {
    let log = common::tools::Log::default();
    let m = remote_manager("box", ssh(), |o| o.tools(common::tools::toolset(&log))).await;
    let a = KernelSpec::default().tools(["echo"]);
    let b = KernelSpec::default().tools(["echo", "noop"]);
    let ra = run_spec(&m.manager, "s", &a, Cell::new("x = 'a'")).await;
    let rb = run_spec(&m.manager, "s", &b, Cell::new("'x' in globals()")).await;
    assert_eq!(rb.value.as_deref(), Some("False"));
    assert_ne!(ra.kernel.pid, rb.kernel.pid);
    let again = run_spec(&m.manager, "s", &a, Cell::new("x")).await;
    assert_eq!(again.value.as_deref(), Some("'a'"));
    m.manager.shutdown().await;
}

#[tokio::test]
async fn remote_cells_call_tools_under_their_own_allow_list_and_budget() {
    let log = common::tools::Log::default();
    let m = remote_manager("box", ssh(), |o| o.tools(common::tools::toolset(&log))).await;
    let spec = KernelSpec::default().tools(["echo", "fail", "noop"]);
    let r = run_spec(
        &m.manager,
        "s",
        &spec,
        Cell::new("import tools\ntools.echo(text='hi', n=2)"),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.value.as_deref(), Some("{'echo': 'hihi'}"));
    assert_eq!(r.tool_calls_made, 1);
    assert_eq!(log.names(), ["echo"]);
    let code = "import tools\ntry:\n    tools.fail(why='nope')\nexcept tools.ToolError as e:\n    print('failed:', e)\n[tools.noop() for _ in range(3)]";
    let r = run_spec(&m.manager, "s", &spec, Cell::new(code)).await;
    assert_eq!(r.stdout, "failed: failed on purpose: nope\n", "{r:?}");
    assert_eq!(r.tool_calls_made, 4);
    let cell = Cell::new("import tools\ntools.noop()\ntools.echo(text='x')").allow(["noop"]);
    let r = run_spec(&m.manager, "s", &spec, cell).await;
    assert_eq!(r.status, Status::Error);
    assert!(
        r.error.unwrap().contains("not allowed in this cell"),
        "allow-list applies"
    );
    let mut cell = Cell::new("import tools\nfor _ in range(3): tools.noop()");
    cell.max_tool_calls = Some(2);
    let r = run_spec(&m.manager, "s", &spec, cell).await;
    assert!(r.error.unwrap().contains("budget"), "budget applies");
    assert_eq!(r.tool_calls_made, 2);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_thread_left_by_a_finished_remote_cell_is_refused_not_served_by_the_next_cell() {
    let log = common::tools::Log::default();
    let m = remote_manager("box", ssh(), |o| o.tools(common::tools::toolset(&log))).await;
    let spec = KernelSpec::default().tools(["echo"]);
    // The thread calls a tool half a second after its cell settled.
    let code = "import threading, time, tools\nout = []\ndef later():\n    time.sleep(0.5)\n    try:\n        out.append(repr(tools.echo(text='late')))\n    except tools.ToolError as e:\n        out.append(str(e))\nthreading.Thread(target=later, daemon=True).start()";
    let r = run_spec(&m.manager, "s", &spec, Cell::new(code)).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let code = "import time\nfor _ in range(100):\n    if out: break\n    time.sleep(0.05)\nout";
    let r = run_spec(&m.manager, "s", &spec, Cell::new(code)).await;
    assert!(
        r.value
            .as_deref()
            .unwrap()
            .contains("refused: no cell is running in this kernel"),
        "{r:?}"
    );
    assert_eq!(r.tool_calls_made, 0, "not counted by the next cell");
    assert_eq!(log.count("echo"), 0, "the late call never reached the tool");
    m.manager.shutdown().await;
}

#[tokio::test]
async fn children_get_their_own_kernels_and_disposal_reaps_only_that_owner() {
    let m = remote_manager("box", ssh(), |o| o).await;
    let child = child_owner("p", "c1").unwrap();
    let p = m.run("p", "x = 'parent'").await.kernel.pid.unwrap();
    let c = m.run(&child, "'x' in globals()").await;
    assert_eq!(
        c.value.as_deref(),
        Some("False"),
        "a child never shares state"
    );
    let c = c.kernel.pid.unwrap();
    let q = m.run("q", "x = 'other'").await.kernel.pid.unwrap();
    assert_eq!(m.manager.dispose_child("p", "c1").await.unwrap(), 1);
    assert!(!alive_via(on_host, c) && alive_via(on_host, p));
    assert_eq!(m.manager.dispose_owner("p").await, 1);
    assert!(!alive_via(on_host, p), "the owner's runner is gone");
    assert!(alive_via(on_host, q), "another owner's runner is untouched");
    assert_eq!(m.run("q", "x").await.value.as_deref(), Some("'other'"));
    m.manager.shutdown().await;
}

#[tokio::test]
async fn idle_remote_kernels_are_reaped_and_the_owner_is_told() {
    let m = remote_manager("box", ssh(), |o| {
        o.idle_timeout(Some(Duration::from_millis(300)))
    })
    .await;
    let pid = m.run("s", "x = 1").await.kernel.pid.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    m.manager.housekeep().await;
    assert!(m.manager.list().is_empty());
    assert!(!alive_via(on_host, pid), "the reaped runner is killed");
    let r = m.run("s", "'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(r.kernel.note.unwrap().contains("idle"));
    m.manager.shutdown().await;
}

#[tokio::test]
async fn lru_eviction_applies_to_remote_kernels_and_skips_a_busy_one() {
    let m = remote_manager("box", ssh(), |o| o.max_kernels(1)).await;
    let a = m.run("a", "x = 1").await.kernel.pid.unwrap();
    let b = m.run("b", "x = 2").await.kernel.pid.unwrap();
    assert!(!alive_via(on_host, a), "a was least recently used");
    let r = m.run("a", "'x' in globals()").await;
    assert!(r.kernel.note.unwrap().contains("evicted"));
    assert!(!alive_via(on_host, b));
    // A busy kernel is never the victim: b's cell finishes, with its state.
    m.run("b", "y = 5").await;
    let busy = tokio::spawn({
        let m = m.manager.clone();
        async move {
            m.execute("b", Cell::new("import time; time.sleep(1.5); y"))
                .await
        }
    });
    // b must be busy (its cell out) before c needs the slot.
    assert!(
        eventually(Duration::from_secs(5), || {
            m.manager
                .list()
                .iter()
                .any(|k| k.owner == "b" && k.state == KernelState::Busy)
        })
        .await,
        "b never became busy"
    );
    m.run("c", "1").await;
    let r = busy.await.unwrap().unwrap();
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.value.as_deref(), Some("5"));
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_request_picks_its_backend_and_local_stays_the_default_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let opts = common::registry::manager_options(&dir).backend("box", ssh());
    let m = cellhost::registry::KernelManager::start(opts).await;
    let local = m
        .execute("s", Cell::new("import os; os.getpid()"))
        .await
        .unwrap();
    assert_eq!(local.kernel.backend, "local");
    let remote = KernelSpec::default().backend("box");
    let r = run_spec(
        &m,
        "s",
        &remote,
        Cell::new("import os; os.environ.get('SSH_CONNECTION', '')"),
    )
    .await;
    assert_eq!(r.kernel.backend, "box");
    assert!(r.value.unwrap().contains("127.0.0.1"), "ran over ssh");
    let e = cellhost::error_chain(
        &m.execute_with("s", &KernelSpec::default().backend("nope"), Cell::new("1"))
            .await
            .unwrap_err(),
    );
    assert!(e.contains("[backends.nope]") && e.contains("box"), "{e}");
    let kinds: Vec<String> = m.list().into_iter().map(|k| k.backend).collect();
    assert!(
        kinds.contains(&"local".into()) && kinds.contains(&"box".into()),
        "{kinds:?}"
    );
    m.shutdown().await;
}

#[tokio::test]
async fn a_fleet_places_new_owners_on_the_least_loaded_host_and_keeps_owners_put() {
    let m = remote_manager("fleet", fleet(), |o| o).await;
    let server = "import os; os.environ['SSH_CONNECTION'].split()[2]";
    let a = m.run("a", server).await.value.unwrap();
    let b = m.run("b", server).await.value.unwrap();
    assert_ne!(a, b, "two owners on two hosts");
    let hosts = [
        env("CELLHOST_TEST_SSH_HOST"),
        env("CELLHOST_TEST_SSH_HOST2"),
    ];
    for v in [&a, &b] {
        assert!(hosts.iter().any(|h| v.contains(h.as_str())), "{v}");
    }
    let other = KernelSpec::default().cwd("/tmp");
    let a2 = run_spec(&m.manager, "a", &other, Cell::new(server))
        .await
        .value
        .unwrap();
    assert_eq!(a2, a, "an owner's second kernel stays on its host");
    let loads = m.manager.backends().host_loads("fleet");
    assert_eq!(loads.iter().map(|(_, n)| n).sum::<usize>(), 3, "{loads:?}");
    m.manager.shutdown().await;
    let loads = m.manager.backends().host_loads("fleet");
    assert!(
        loads.iter().all(|(_, n)| *n == 0),
        "leases end with their kernels: {loads:?}"
    );
}

#[tokio::test]
async fn an_interrupt_from_the_host_stops_a_remote_cell_and_keeps_state() {
    let m = remote_manager("box", ssh(), |o| o).await;
    m.run("s", "x = 3").await;
    let running = tokio::spawn({
        let m = m.manager.clone();
        async move {
            m.execute("s", Cell::new("import time\nwhile True: time.sleep(0.05)"))
                .await
        }
    });
    let busy = common::registry::eventually(Duration::from_secs(10), || {
        m.manager
            .list()
            .iter()
            .any(|k| k.state == cellhost::KernelState::Busy)
    })
    .await;
    assert!(busy);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(m.manager.interrupt("s").await, 1);
    let r = running.await.unwrap().unwrap();
    assert_eq!(r.status, Status::Interrupted, "{r:?}");
    assert!(!r.kernel.state_lost);
    assert_eq!(m.run("s", "x").await.value.as_deref(), Some("3"));
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_session_default_backend_applies_to_the_session_and_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let opts = common::registry::manager_options(&dir).backend("box", ssh());
    let m = cellhost::registry::KernelManager::start(opts).await;
    let e = m
        .backends()
        .set_session_default("s", Some("nope"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("[backends.nope]"), "{e}");
    m.backends().set_session_default("s", Some("box")).unwrap();
    let r = m.execute("s", Cell::new("1")).await.unwrap();
    assert_eq!(r.kernel.backend, "box");
    let child = child_owner("s", "c").unwrap();
    assert_eq!(
        m.execute(&child, Cell::new("1"))
            .await
            .unwrap()
            .kernel
            .backend,
        "box"
    );
    assert_eq!(
        m.execute("t", Cell::new("1")).await.unwrap().kernel.backend,
        "local"
    );
    let local = KernelSpec::default().backend("local");
    assert_eq!(
        run_spec(&m, "s", &local, Cell::new("1"))
            .await
            .kernel
            .backend,
        "local"
    );
    m.shutdown().await;
}

#[tokio::test]
async fn a_slow_remote_tool_call_is_cancelled_at_the_cell_timeout_and_state_is_kept() {
    let log = common::tools::Log::default();
    let m = remote_manager("box", ssh(), |o| o.tools(common::tools::toolset(&log))).await;
    let spec = KernelSpec::default().tools(["slow"]);
    run_spec(&m.manager, "s", &spec, Cell::new("x = 9")).await;
    let cell = Cell::new("import tools\ntools.slow()").timeout(Duration::from_millis(800));
    let r = run_spec(&m.manager, "s", &spec, cell).await;
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert!(!r.kernel.state_lost);
    assert!(
        common::registry::eventually(Duration::from_secs(5), || log
            .cancelled
            .load(std::sync::atomic::Ordering::SeqCst))
        .await,
        "the tool call was cancelled"
    );
    let r = run_spec(&m.manager, "s", &spec, Cell::new("x")).await;
    assert_eq!(r.value.as_deref(), Some("9"));
    m.manager.shutdown().await;
}

#[tokio::test]
async fn an_oversized_remote_tool_request_is_refused_by_the_host() {
    let log = common::tools::Log::default();
    let m = remote_manager("box", ssh(), |o| o.tools(common::tools::toolset(&log))).await;
    let spec = KernelSpec::default().tools(["echo"]);
    // The cell lifts the runner's own check: the host must still refuse.
    let code = "import tools\ntools.MAX_PAYLOAD = 1 << 30\ntry:\n    tools.echo(text='x' * (11 << 20))\nexcept tools.ToolError as e:\n    print('refused:', e)\n";
    let r = run_spec(&m.manager, "s", &spec, Cell::new(code)).await;
    assert_eq!(r.status, Status::Success, "{:?}", r.error);
    assert!(
        r.stdout.contains("refused: tool request refused") && r.stdout.contains("limit"),
        "{:?}",
        r.stdout
    );
    let r = run_spec(&m.manager, "s", &spec, Cell::new("1")).await;
    assert!(r.kernel.reused && !r.kernel.state_lost);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_fleet_host_that_cannot_connect_is_skipped_and_backed_off() {
    // 127.0.0.2 has no sshd (connection refused at once); it is first in
    // the list, so with equal loads every new owner was placed there.
    let backend = cellhost::config::BackendConfig::Ssh(common::remote::ssh_config(&[
        "127.0.0.2",
        &env("CELLHOST_TEST_SSH_HOST"),
    ]));
    let m = remote_manager("fleet", backend, |o| o).await;
    for owner in ["a", "b"] {
        let r = m.run(owner, "1").await;
        assert_eq!(r.status, Status::Success, "{owner}: {:?}", r.error);
        assert_eq!(
            m.manager.backends().host_of("fleet", owner).as_deref(),
            Some(env("CELLHOST_TEST_SSH_HOST").as_str())
        );
    }
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_fleet_session_runs_on_the_host_its_first_upload_went_to() {
    let m = remote_manager("fleet", fleet(), |o| {
        o.idle_timeout(Some(Duration::from_millis(300)))
    })
    .await;
    let server = "import os; os.environ['SSH_CONNECTION'].split()[2]";
    // The upload comes first: it goes to the least loaded host.
    let ws = m.manager.workspace("s").unwrap();
    ws.write(
        "in.txt",
        &b"here"[..],
        cellhost::files::WriteLimits::default(),
    )
    .await
    .unwrap();
    // Another owner's kernel now makes that host the busier one.
    let a = m.run("a", server).await.value.unwrap();
    let r = m
        .run(
            "s",
            "import os\n(open('in.txt').read(), os.environ['SSH_CONNECTION'].split()[2])",
        )
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let v = r.value.unwrap();
    assert_eq!(v, format!("('here', {a})"), "s runs where its file is");
    // After its kernel is reaped, with loads changed again, it comes back.
    tokio::time::sleep(Duration::from_millis(400)).await;
    m.manager.housekeep().await;
    let a2 = m.run("a", server).await.value.unwrap();
    assert_eq!(a2, a);
    let r = m.run("s", "open('in.txt').read()").await;
    assert_eq!(r.value.as_deref(), Some("'here'"), "{r:?}");
    m.manager.shutdown().await;
}
