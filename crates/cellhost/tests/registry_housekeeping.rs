//! The cap, idle reaping and the warm pool: which kernels die, that they
//! really die, and that the next call says why.

mod common;

use std::sync::Arc;
use std::time::Duration;

use cellhost::registry::child_owner;
use cellhost::{Cell, Status};
use common::pid_alive;
use common::registry::{eventually, manager_with};

#[tokio::test]
async fn the_lru_cap_holds_across_owners_and_evicted_kernels_are_dead() {
    let m = manager_with(|o| o.max_kernels(2)).await;
    let a = m.run("a", "x = 'a'").await.kernel.pid.unwrap();
    let b = m.run("b", "x = 'b'").await.kernel.pid.unwrap();
    m.run("a", "x").await; // a is now more recent than b
    let c = m.run("c", "x = 'c'").await.kernel.pid.unwrap();
    assert!(
        !pid_alive(b),
        "the least recently used kernel was evicted and waited on"
    );
    assert!(pid_alive(a) && pid_alive(c));
    assert_eq!(m.runner_pids().len(), 2);
    assert_eq!(m.manager.stats().evictions, 1);

    let back = m.run("b", "x").await;
    assert_eq!(back.status, Status::Error, "state is gone: {back:?}");
    assert!(back.kernel.state_lost);
    let note = back.kernel.note.unwrap();
    assert!(
        note.contains("evicted") && note.contains("at most 2"),
        "{note}"
    );
    // Told once: the following call is an ordinary warm one.
    let next = m.run("b", "x = 1").await;
    assert!(!next.kernel.state_lost && next.kernel.note.is_none());
    assert_eq!(m.runner_pids().len(), 2);
    m.manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_never_evicts_a_kernel_with_a_running_cell() {
    let m = Arc::new(manager_with(|o| o.max_kernels(1)).await);
    m.run("busy", "x = 1").await;
    let busy = {
        let m = m.clone();
        tokio::spawn(async move {
            m.manager
                .execute("busy", Cell::new("import time; time.sleep(1.0); x"))
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = m.run("other", "2").await;
    assert_eq!(
        other.value.as_deref(),
        Some("2"),
        "the new owner is served over the cap"
    );
    let busy = busy.await.unwrap();
    assert_eq!(busy.status, Status::Success, "{busy:?}");
    assert_eq!(busy.value.as_deref(), Some("1"));
    assert!(!busy.kernel.state_lost);
    // Once idle, the cap is enforced again.
    m.manager.housekeep().await;
    assert_eq!(m.runner_pids().len(), 1);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn live_children_keep_their_kernels_past_the_cap_and_finished_ones_release_them() {
    let m = manager_with(|o| o.max_kernels(1)).await;
    let c1 = child_owner("p", "1").unwrap();
    let c2 = child_owner("p", "2").unwrap();
    let k1 = m.run(&c1, "x = 1").await.kernel.pid.unwrap();
    let k2 = m.run(&c2, "x = 2").await.kernel.pid.unwrap();
    let parent = m.run("p", "x = 0").await.kernel.pid.unwrap();
    let q = m.run("q", "1").await.kernel.pid.unwrap();
    assert!(
        pid_alive(k1) && pid_alive(k2),
        "pinned children survive the cap"
    );
    assert!(!pid_alive(parent), "the unpinned parent was the LRU victim");
    assert_eq!(m.run(&c1, "x").await.value.as_deref(), Some("1"));
    assert!(
        !pid_alive(q),
        "children count against the cap: q was evicted"
    );
    m.manager.dispose_child("p", "1").await.unwrap();
    m.manager.dispose_child("p", "2").await.unwrap();
    assert!(!pid_alive(k1) && !pid_alive(k2));
    assert!(m.runner_pids().is_empty());
    // Finished children released their room and their pins.
    let p2 = m.run("p", "1").await.kernel.pid.unwrap();
    m.run("q", "1").await;
    assert!(
        !pid_alive(p2),
        "with the children gone, p is evictable again"
    );
    m.manager.shutdown().await;
}

#[tokio::test]
async fn idle_kernels_are_reaped_on_acquire() {
    let m = manager_with(|o| {
        o.idle_timeout(Some(Duration::from_millis(400)))
            .reap_interval(Duration::from_secs(3600))
    })
    .await;
    let old = m.run("old", "x = 1").await.kernel.pid.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    m.run("new", "1").await;
    assert!(!pid_alive(old), "reaped by the acquire of another owner");
    let back = m.run("old", "x").await;
    assert!(back.kernel.state_lost);
    assert!(back.kernel.note.unwrap().contains("idle"));
    assert_eq!(m.manager.stats().reaps, 1);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn idle_kernels_are_reaped_by_the_background_pass_without_traffic() {
    let m = manager_with(|o| {
        o.idle_timeout(Some(Duration::from_millis(300)))
            .reap_interval(Duration::from_millis(100))
    })
    .await;
    let pid = m.run("p", "x = 1").await.kernel.pid.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || !pid_alive(pid)).await,
        "no call was made, yet the idle kernel died"
    );
    assert!(m.manager.list().is_empty());
    m.manager.shutdown().await;
}

#[tokio::test]
async fn attached_owners_are_spared_by_reaping() {
    let m = manager_with(|o| {
        o.idle_timeout(Some(Duration::from_millis(200)))
            .reap_interval(Duration::from_millis(50))
    })
    .await;
    let guard = m.manager.attach("p");
    let pid = m.run("p", "x = 1").await.kernel.pid.unwrap();
    let other = m.run("q", "1").await.kernel.pid.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(pid_alive(pid), "attached: spared");
    assert!(!pid_alive(other), "not attached: reaped");
    drop(guard);
    assert!(eventually(Duration::from_secs(5), || !pid_alive(pid)).await);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_running_cell_is_never_reaped_however_long_it_runs() {
    let m = manager_with(|o| {
        o.idle_timeout(Some(Duration::from_millis(200)))
            .reap_interval(Duration::from_millis(50))
    })
    .await;
    let r = m.run("p", "import time; time.sleep(0.8); 'done'").await;
    assert_eq!(r.value.as_deref(), Some("'done'"));
    assert!(!r.kernel.state_lost);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_new_owners_first_cell_is_served_by_a_pooled_kernel() {
    let m = manager_with(|o| o.warm_pool(1)).await;
    assert!(eventually(Duration::from_secs(10), || m.manager.pooled() == 1).await);
    let pooled = m.runner_pids();
    assert_eq!(pooled.len(), 1);
    let r = m.run("new", "x = 1; x").await;
    assert_eq!(r.value.as_deref(), Some("1"));
    assert_eq!(
        r.kernel.pid,
        Some(pooled[0]),
        "the pooled process ran the cell"
    );
    assert!(!r.kernel.reused && !r.kernel.state_lost && r.kernel.note.is_none());
    assert_eq!(m.manager.stats().pool_hits, 1);
    // The pool refills in the background.
    assert!(eventually(Duration::from_secs(10), || m.manager.pooled() == 1).await);
    assert_eq!(m.runner_pids().len(), 2);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_pooled_kernel_that_died_is_never_handed_out() {
    let m = manager_with(|o| o.warm_pool(1)).await;
    assert!(eventually(Duration::from_secs(10), || m.manager.pooled() == 1).await);
    let dead = m.runner_pids()[0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dead as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    assert!(common::wait_gone(dead, Duration::from_secs(5)));
    let r = m.run("new", "1").await;
    assert_eq!(r.status, Status::Success);
    assert!(
        !r.kernel.state_lost,
        "a new owner lost nothing: {:?}",
        r.kernel
    );
    assert_ne!(r.kernel.pid, Some(dead));
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_cell_whose_caller_gave_up_still_counts_as_running() {
    let m = manager_with(|o| o.max_kernels(1)).await;
    m.run("a", "x = 1").await;
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        m.manager
            .execute("a", Cell::new("import time; time.sleep(1.5); y = 2")),
    )
    .await;
    assert!(gave_up.is_err());
    m.run("b", "1").await; // over the cap, but a's cell still runs
    assert_eq!(m.manager.stats().evictions, 0, "a running cell was evicted");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = m.run("a", "x + y").await;
    assert_eq!(r.value.as_deref(), Some("3"), "{r:?}");
    m.manager.shutdown().await;
}

#[tokio::test]
async fn the_news_of_an_eviction_waits_for_a_call_that_hears_it() {
    let m = manager_with(|o| o.max_kernels(1)).await;
    m.run("a", "x = 1").await;
    m.run("b", "1").await; // evicts a
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        m.manager
            .execute("a", Cell::new("import time; time.sleep(1)")),
    )
    .await;
    assert!(gave_up.is_err(), "the caller gave up before its result");
    let r = m.run("a", "x").await;
    assert!(r.kernel.state_lost, "{:?}", r.kernel);
    assert!(r.kernel.note.unwrap().contains("evicted"));
    m.manager.shutdown().await;
}

#[tokio::test]
async fn the_pool_refills_after_its_kernels_died() {
    let m = manager_with(|o| o.warm_pool(1)).await;
    assert!(eventually(Duration::from_secs(10), || m.manager.pooled() == 1).await);
    let pooled = m.runner_pids()[0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pooled as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    assert!(common::wait_gone(pooled, Duration::from_secs(5)));
    m.run("a", "1").await; // a miss: spawned on demand
    assert!(
        eventually(Duration::from_secs(10), || m.manager.pooled() == 1).await,
        "the pool refilled after the miss"
    );
    m.manager.shutdown().await;
}

#[tokio::test]
async fn shutdown_waits_for_kills_that_housekeeping_began() {
    let m = Arc::new(
        manager_with(|o| {
            o.idle_timeout(Some(Duration::from_millis(200)))
                .reap_interval(Duration::from_secs(3600))
        })
        .await,
    );
    // Ignoring SIGTERM makes its teardown take the whole grace period.
    let pid = m
        .run(
            "a",
            "import os, signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); os.getpid()",
        )
        .await
        .kernel
        .pid
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reaping = {
        let m = m.clone();
        tokio::spawn(async move { m.manager.housekeep().await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    m.manager.shutdown().await;
    assert!(
        !pid_alive(pid),
        "shutdown returned while the reaped kernel lived"
    );
    reaping.await.unwrap();
}
