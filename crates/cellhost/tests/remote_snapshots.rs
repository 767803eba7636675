//! Snapshots of remote kernels (real sshd and dockerd, started by
//! scripts/test): the stream stays on the remote host, in a file beside
//! the kernel dirs; the host keeps only its description. An evicted
//! remote session comes back with its state, a snapshot over the cap is
//! refused there, and a fork's copy is made there.

mod common;

use cellhost::registry::ManagerError;
use cellhost::{Cell, RestoreFrom, SnapshotError};
use common::remote::{docker, docker_sh, env, remote_manager, ssh, ssh_sh};

const MAX: u64 = 64 << 20;

fn on_host(s: &str) -> String {
    ssh_sh(&env("CELLHOST_TEST_SSH_HOST"), s)
}

/// The remote host's snapshot files (under its temp dir).
const LIST: &str = "ls \"${TMPDIR:-/tmp}/cellhost-snapshots\" 2>/dev/null";

async fn run(
    m: &cellhost::registry::KernelManager,
    owner: &str,
    code: &str,
) -> cellhost::CellResult {
    m.execute(owner, Cell::new(code)).await.expect("execute")
}

#[tokio::test]
async fn an_evicted_remote_session_comes_back_with_its_state_kept_on_its_host() {
    let m = remote_manager("box", ssh(), |o| o.snapshots(Some(MAX)).max_kernels(1)).await;
    let owner = format!("rs-{}", std::process::id());
    let r = run(&m.manager, &owner, "import json\nn = 5\nd = {'k': [1, 2]}").await;
    assert!(r.is_success(), "{r:?}");
    run(&m.manager, "other", "1").await; // evicts it: snapshotted on the host
    let local: Vec<String> = std::fs::read_dir(m.manager.options().snapshot_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        local.iter().all(|n| n.ends_with(".json")),
        "only descriptions stay here: {local:?}"
    );
    let there = on_host(LIST);
    assert!(
        there.lines().any(|l| l.starts_with(&format!("{owner}-"))),
        "the stream is on the remote host: {there:?}"
    );
    let back = run(&m.manager, &owner, "n += 1\n(n, d, json.dumps([1]))").await;
    assert_eq!(
        back.value.as_deref(),
        Some("(6, {'k': [1, 2]}, '[1]')"),
        "{back:?}"
    );
    let k = &back.kernel;
    assert_eq!(
        k.restored.as_ref().map(|r| r.from),
        Some(RestoreFrom::Evicted)
    );
    assert!(!k.state_lost, "{k:?}");
    assert!(
        !on_host(LIST)
            .lines()
            .any(|l| l.starts_with(&format!("{owner}-"))),
        "a loaded snapshot is consumed"
    );
    // A fork: the copy is made on the host, the new session runs there.
    let ws = m.manager.workspace(&owner).unwrap();
    let limits = cellhost::files::WriteLimits { max_bytes: None };
    ws.write("f.txt", &b"remote"[..], limits).await.unwrap();
    let target = format!("{owner}-fork");
    let report = m
        .manager
        .fork(&owner, std::slice::from_ref(&target))
        .await
        .expect("fork");
    assert_eq!(report.into[0].workspace_bytes, 6, "{report:?}");
    let f = run(
        &m.manager,
        &target,
        "d['k'].append(3)\n(n, d, open('f.txt').read())",
    )
    .await;
    assert_eq!(
        f.value.as_deref(),
        Some("(6, {'k': [1, 2, 3]}, 'remote')"),
        "{f:?}"
    );
    assert_eq!(f.kernel.forked_from.as_deref(), Some(owner.as_str()));
    assert_eq!(f.kernel.backend, "box");
    let src = run(&m.manager, &owner, "d").await;
    assert_eq!(
        src.value.as_deref(),
        Some("{'k': [1, 2]}"),
        "the source is its own"
    );
    m.manager.shutdown().await;
}

#[tokio::test]
async fn a_remote_snapshot_on_request_is_capped_on_its_host_and_forks_are_made_there() {
    let m = remote_manager("box", docker(), |o| o.snapshots(Some(1 << 20))).await;
    let owner = format!("rd-{}", std::process::id());
    run(
        &m.manager,
        &owner,
        "x = 1\nimport socket\nsock = socket.socket()",
    )
    .await;
    let report = m.manager.snapshot(&owner).await.expect("snapshot");
    assert_eq!(report.names, 2, "{report:?}");
    assert_eq!(report.skipped[0].name, "sock");
    assert!(report.bytes > 0);
    let listed = docker_sh(&env("CELLHOST_TEST_DOCKER_CONTAINER"), LIST);
    assert!(
        listed.lines().any(|l| l.starts_with(&format!("{owner}-"))),
        "{listed:?}"
    );
    run(&m.manager, &owner, "big = bytes(2 << 20)").await;
    let err = m.manager.snapshot(&owner).await.unwrap_err();
    assert!(
        matches!(err, ManagerError::Snapshot(SnapshotError::TooLarge { .. })),
        "{err}"
    );
    let listed = docker_sh(&env("CELLHOST_TEST_DOCKER_CONTAINER"), LIST);
    assert!(
        !listed.lines().any(|l| l.starts_with(&format!("{owner}-"))),
        "no snapshot stands for a state over the cap: {listed:?}"
    );
    let r = run(&m.manager, &owner, "len(big) + x").await;
    assert_eq!(r.value.as_deref(), Some("2097153"), "the kernel lives on");
    // Over the cap, a fork is refused as the snapshot is.
    let target = format!("{owner}-f");
    let err = m
        .manager
        .fork(&owner, std::slice::from_ref(&target))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ManagerError::Snapshot(SnapshotError::TooLarge { .. })),
        "{err}"
    );
    run(&m.manager, &owner, "del big").await;
    m.manager
        .fork(&owner, std::slice::from_ref(&target))
        .await
        .expect("fork");
    let r = run(&m.manager, &target, "x + 1").await;
    assert_eq!(r.value.as_deref(), Some("2"), "{r:?}");
    assert!(
        r.kernel.restored.is_some() && r.kernel.forked_from.is_some(),
        "{r:?}"
    );
    m.manager.shutdown().await;
}
