//! Remote kernels over a real OpenSSH server on 127.0.0.1 (started by
//! scripts/test): hermes-agent's remote-kernel tests, ported.

mod common;

use std::time::Duration;

use cellhost::Status;
use common::remote::{alive_via, env, remote_manager, ssh, ssh_sh};

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
