//! An outage of the ssh server a live session runs on (an sshd of the
//! test's own, stopped and started again; the shared one is never
//! touched): the failure says what failed, and the runner given up on is
//! killed once the server is back, never forgotten.

mod common;

use std::time::Duration;

use cellhost::config::BackendConfig;
use cellhost::{Cell, Status};
use common::remote::{remote_manager, ssh_config};
use common::sshd::OwnSshd;
use common::{pid_alive, wait_gone};

fn backend(sshd: &OwnSshd) -> BackendConfig {
    let mut c = ssh_config(&["127.0.0.1"]);
    c.port = Some(sshd.port);
    BackendConfig::Ssh(c)
}

#[tokio::test]
async fn a_connection_lost_mid_cell_says_what_failed() {
    let mut sshd = OwnSshd::start();
    let m = remote_manager("box", backend(&sshd), |o| o).await;
    let a = m.run("s", "x = 1").await;
    assert_eq!(a.status, Status::Success, "{a:?}");
    let runner = a.kernel.pid.unwrap();
    let cell = tokio::spawn({
        let m = m.manager.clone();
        async move {
            m.execute("s", Cell::new("import time; time.sleep(3)"))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    sshd.down();
    let r = cell.await.unwrap().unwrap();
    assert_eq!(r.status, Status::Error);
    assert!(r.kernel.state_lost);
    let e = r.error.unwrap();
    assert!(
        e.starts_with(&format!(
            "TransportError: ssh cellhost-test@127.0.0.1:{} failed: ",
            sshd.port
        )),
        "{e}"
    );
    assert!(
        e.contains("connection refused") && !e.contains("failed: ."),
        "the cause is named: {e}"
    );
    // Back up: the daemon's shutdown kills the runner it gave up on.
    sshd.up();
    assert!(pid_alive(runner));
    m.manager.shutdown().await;
    assert!(
        wait_gone(runner, Duration::from_secs(5)),
        "old runner {runner} lives on"
    );
}

#[tokio::test]
async fn the_runner_given_up_on_in_an_outage_is_killed_when_the_server_returns() {
    let mut sshd = OwnSshd::start();
    let m = remote_manager("box", backend(&sshd), |o| o).await;
    let a = m.run("s", "x = 1").await;
    assert_eq!(a.status, Status::Success, "{a:?}");
    let old = a.kernel.pid.unwrap();
    sshd.down();
    // Two cells during the outage: the first loses the kernel, the second
    // cannot start one.
    let r = m.manager.execute("s", Cell::new("x")).await.unwrap();
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert!(r.error.unwrap().contains("connection refused"));
    let e = m.manager.execute("s", Cell::new("x")).await.unwrap_err();
    let e = cellhost::error_chain(&e);
    assert!(e.contains("connection refused"), "{e}");
    assert!(pid_alive(old), "the old runner outlives the outage");
    sshd.up();
    let r = m.run("s", "'x' in globals()").await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.value.as_deref(), Some("False"), "a fresh kernel");
    assert!(!r.kernel.reused);
    let new = r.kernel.pid.unwrap();
    assert_ne!(new, old);
    assert!(
        wait_gone(old, Duration::from_secs(5)),
        "the old runner {old} (its state and dir) lives on"
    );
    m.manager.shutdown().await;
    assert!(wait_gone(new, Duration::from_secs(5)));
}
