//! Ownership: one kernel per owner, isolation between sessions and
//! delegated children, disposal, and one process per owner under
//! parallel callers. Real processes throughout.

mod common;

use std::sync::Arc;
use std::time::Duration;

use cellhost::registry::{child_owner, KernelSpec, ManagerError};
use cellhost::{Cell, KernelState, Status};
use common::registry::{manager_with, TestManager};
use common::wait_gone;

async fn plain() -> TestManager {
    manager_with(|o| o).await
}

#[tokio::test]
async fn state_survives_turns_of_one_conversation_and_sessions_are_isolated() {
    let m = plain().await;
    m.run("conv-a", "x = 'a'").await;
    m.run("conv-b", "x = 'b'").await;
    let a = m.run("conv-a", "x").await;
    let b = m.run("conv-b", "x").await;
    assert_eq!(a.value.as_deref(), Some("'a'"));
    assert_eq!(b.value.as_deref(), Some("'b'"));
    assert!(a.kernel.reused && !a.kernel.state_lost);
    assert_eq!(a.kernel.execution_count, 2);
    assert_ne!(a.kernel.pid, b.kernel.pid);
    assert_eq!(m.runner_pids().len(), 2);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn delegated_children_are_isolated_from_parent_and_siblings_both_ways() {
    let m = plain().await;
    let c1 = child_owner("p", "1").unwrap();
    let c2 = child_owner("p", "2").unwrap();
    m.run("p", "secret = 'parent'").await;
    m.run(&c1, "secret = 'child1'").await;
    m.run(&c2, "mine = 2").await;
    for (owner, code) in [
        (c2.as_str(), "secret"),
        ("p", "mine"),
        (c1.as_str(), "mine"),
    ] {
        let r = m.run(owner, code).await;
        assert_eq!(r.status, Status::Error, "{owner} sees {code}: {r:?}");
        assert!(r.error.unwrap().contains("NameError"));
    }
    assert_eq!(
        m.run("p", "secret").await.value.as_deref(),
        Some("'parent'")
    );
    assert_eq!(
        m.run(&c1, "secret").await.value.as_deref(),
        Some("'child1'")
    );
    m.manager.shutdown().await;
}

#[tokio::test]
async fn dispose_child_kills_only_that_child_and_dispose_owner_kills_the_rest() {
    let m = plain().await;
    let c1 = child_owner("p", "1").unwrap();
    let c2 = child_owner("p", "2").unwrap();
    let pid = |r: cellhost::CellResult| r.kernel.pid.unwrap();
    let parent = pid(m.run("p", "x = 1").await);
    let first = pid(m.run(&c1, "x = 1").await);
    let second = pid(m.run(&c2, "x = 1").await);
    let other = pid(m.run("other", "x = 1").await);

    assert_eq!(m.manager.dispose_child("p", "1").await.unwrap(), 1);
    assert!(
        !common::pid_alive(first),
        "disposed child's kernel is dead on return"
    );
    assert!(common::pid_alive(parent) && common::pid_alive(second));

    let again = m.run(&c1, "x").await;
    assert_eq!(again.status, Status::Error);
    assert!(again.kernel.state_reset, "{:?}", again.kernel);
    assert!(again.kernel.note.unwrap().contains("disposed"));

    // The session's reset takes its children (including the new c1) too.
    assert_eq!(m.manager.dispose_owner("p").await, 3);
    assert!(!common::pid_alive(parent) && !common::pid_alive(second));
    assert!(common::pid_alive(other), "another session is untouched");
    assert_eq!(m.runner_pids(), vec![other]);
    assert_eq!(m.run("p", "1").await.value.as_deref(), Some("1"));
    m.manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_cells_for_one_owner_share_one_process_and_none_fails() {
    let m = Arc::new(plain().await);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let m = m.clone();
        tasks.push(tokio::spawn(async move {
            let code = format!("import os, time\ntime.sleep(0.02)\nseen = globals().setdefault('seen', [])\nseen.append({i})\nos.getpid()");
            m.manager.execute("p", Cell::new(code)).await
        }));
    }
    // While they queue: exactly one real process, never more.
    let mut most = 0;
    for _ in 0..10 {
        most = most.max(m.runner_pids().len());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut pids = Vec::new();
    let mut counts = Vec::new();
    for t in tasks {
        let r = t.await.unwrap().expect("no caller fails");
        assert_eq!(r.status, Status::Success, "{r:?}");
        pids.push(r.value.unwrap());
        counts.push(r.kernel.execution_count);
    }
    pids.dedup();
    assert_eq!(pids.len(), 1, "one process served all: {pids:?}");
    counts.sort();
    assert_eq!(counts, (1..=8).collect::<Vec<u64>>());
    assert!(most <= 1, "saw {most} runner processes at once");
    assert_eq!(m.runner_pids().len(), 1);
    let seen = m.run("p", "sorted(seen)").await;
    assert_eq!(seen.value.as_deref(), Some("[0, 1, 2, 3, 4, 5, 6, 7]"));
    m.manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_for_one_owner_run_in_arrival_order() {
    let m = Arc::new(plain().await);
    m.run("p", "log = []").await;
    let mut tasks = Vec::new();
    for i in 0..6 {
        let m = m.clone();
        tasks.push(tokio::spawn(async move {
            m.manager
                .execute(
                    "p",
                    Cell::new(format!("import time; time.sleep(0.01); log.append({i})")),
                )
                .await
        }));
        // Each caller arrives clearly after the previous one queued.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let log = m.run("p", "log").await;
    assert_eq!(log.value.as_deref(), Some("[0, 1, 2, 3, 4, 5]"));
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_different_tool_set_or_cwd_gets_a_different_kernel() {
    let log = common::tools::Log::default();
    let m = manager_with(|o| o.tools(common::tools::toolset(&log))).await;
    let dir = tempfile::tempdir().unwrap();
    let tools_ab = KernelSpec::default().tools(["noop", "echo"]);
    let tools_ba = KernelSpec::default().tools(["echo", "noop"]);
    let in_dir = KernelSpec::default().cwd(dir.path());
    let run = |spec: &KernelSpec, code: &str| {
        let spec = spec.clone();
        let code = code.to_owned();
        let mgr = m.manager.clone();
        async move { mgr.execute_with("p", &spec, Cell::new(code)).await.unwrap() }
    };
    run(&tools_ab, "x = 'tools'").await;
    assert_eq!(run(&tools_ba, "x").await.value.as_deref(), Some("'tools'"));
    let cwd = run(&in_dir, "import os; os.getcwd()").await;
    assert_eq!(
        cwd.value.unwrap(),
        format!("{:?}", dir.path().to_str().unwrap()).replace('"', "'")
    );
    assert_eq!(
        run(&in_dir, "'x' in globals()").await.value.as_deref(),
        Some("False")
    );
    assert_eq!(m.manager.list().len(), 2);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn list_describes_each_kernel() {
    let m = plain().await;
    m.run("p", "x = 1").await;
    m.run("p", "y = 2").await;
    let c = child_owner("p", "c").unwrap();
    m.run(&c, "1").await;
    let list = m.manager.list();
    assert_eq!(list.len(), 2);
    let p = list.iter().find(|k| k.owner == "p").unwrap();
    assert_eq!(p.state, KernelState::Idle);
    assert_eq!(p.execution_count, 2);
    assert!(p.id.starts_with("k-"), "{p:?}");
    assert_eq!(p.backend, "local");
    assert!(p.rss_bytes.unwrap() > 1_000_000);
    assert!(p.created > 1.7e9 && p.last_used >= p.created);
    assert!(p.idle_seconds >= 0.0 && p.idle_seconds < 60.0);
    assert!(common::pid_alive(p.pid.unwrap()));
    let json = serde_json::to_value(&list).unwrap();
    assert_eq!(json[0]["state"], "idle");
    m.manager.shutdown().await;
}

#[tokio::test]
async fn bad_owner_names_are_clear_errors_and_lose_nothing() {
    let m = plain().await;
    m.run("p", "x = 1").await;
    for bad in ["", "a\u{0}b", &"x".repeat(600)] {
        let err = m.manager.execute(bad, Cell::new("1")).await.unwrap_err();
        assert!(matches!(err, ManagerError::Owner(_)), "{err}");
        assert!(err.to_string().contains("session id"), "{err}");
    }
    let err = m.manager.dispose_child("p", "a::b").await.unwrap_err();
    assert!(err.to_string().contains("child id"), "{err}");
    assert_eq!(m.run("p", "x").await.value.as_deref(), Some("1"));
    m.manager.shutdown().await;
}

#[tokio::test]
async fn shutdown_kills_everything_waits_and_refuses_later_calls() {
    let m = manager_with(|o| o.warm_pool(1)).await;
    let pid = m.run("p", "1").await.kernel.pid.unwrap();
    assert!(
        common::registry::eventually(Duration::from_secs(10), || m.manager.pooled() == 1).await
    );
    assert_eq!(m.runner_pids().len(), 2);
    m.manager.shutdown().await;
    assert!(!common::pid_alive(pid));
    assert!(m.runner_pids().is_empty(), "pool kernels die too");
    let err = m.manager.execute("p", Cell::new("1")).await.unwrap_err();
    assert!(matches!(err, ManagerError::ShutDown), "{err}");
    m.manager.shutdown().await; // idempotent
    assert!(wait_gone(pid, Duration::from_millis(1)));
}

#[test]
fn manager_futures_are_send() {
    fn is_send<T: Send>(_: &T) {}
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let m = plain().await;
        let fut = m.manager.execute("p", Cell::new("1"));
        is_send(&fut);
        drop(fut);
        m.manager.shutdown().await;
    });
}

#[tokio::test]
async fn a_caller_that_gives_up_never_wedges_its_kernel() {
    let m = plain().await;
    // Given up while the kernel starts: nothing ran, nothing leaks.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(1),
        m.manager.execute("p", Cell::new("x = 1")),
    )
    .await;
    assert!(gave_up.is_err());
    m.run("p", "x = 1").await;
    // Given up while its cell runs: the cell was sent, so it still runs,
    // before anything queued after it.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(100),
        m.manager
            .execute("p", Cell::new("import time; time.sleep(0.5); y = 2")),
    )
    .await;
    assert!(gave_up.is_err());
    let r = m.run("p", "x + y").await;
    assert_eq!(r.value.as_deref(), Some("3"), "{r:?}");
    let list = m.manager.list();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].state, KernelState::Idle);
    assert!(
        common::registry::eventually(Duration::from_secs(5), || m.runner_pids().len() == 1).await,
        "an abandoned spawn leaves no process: {:?}",
        m.runner_pids()
    );
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_kernel_that_cannot_start_leaves_no_entry_behind() {
    let m = plain().await;
    for i in 0..3 {
        let spec = KernelSpec::default().python(format!("/nonexistent/py{i}"));
        let err = m
            .manager
            .execute_with("p", &spec, Cell::new("1"))
            .await
            .unwrap_err();
        let err = cellhost::error_chain(&err);
        assert!(err.contains("nonexistent"), "{err}");
    }
    assert!(m.manager.list().is_empty(), "{:?}", m.manager.list());
    assert_eq!(m.run("p", "1").await.value.as_deref(), Some("1"));
    m.manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_a_kernel_still_starting() {
    let m = Arc::new(plain().await);
    // A slow interpreter: a shim that takes a second before Python runs.
    let shim = m.dir.path().join("slow-python");
    std::fs::write(&shim, "#!/bin/sh\nsleep 1\nexec /usr/bin/python3 \"$@\"\n").unwrap();
    let mut perms = std::fs::metadata(&shim).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&shim, perms).unwrap();
    let starting = {
        let m = m.clone();
        let spec = KernelSpec::default().python(&shim);
        tokio::spawn(async move { m.manager.execute_with("p", &spec, Cell::new("1")).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    m.manager.shutdown().await;
    assert!(
        m.runner_pids().is_empty(),
        "a kernel outlived shutdown: {:?}",
        m.runner_pids()
    );
    let r = starting.await.unwrap();
    assert!(matches!(r, Err(ManagerError::ShutDown)), "{r:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(m.runner_pids().is_empty());
}
