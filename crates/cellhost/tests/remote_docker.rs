//! Remote kernels in containers of a real dockerd (started by
//! scripts/test), and the kubectl exec contract through a stand-in client
//! that forwards to that dockerd (no Kubernetes cluster exists here).

mod common;

use std::time::Duration;

use cellhost::{Cell, Status};
use common::remote::{
    alive_via, docker, docker_image, docker_sh, env, kubectl_standin, remote_manager, SHORT,
};

fn in_container(s: &str) -> String {
    docker_sh(&env("CELLHOST_TEST_DOCKER_CONTAINER"), s)
}

/// Containers of the test image started by a manager of this test process
/// (its `cellhost.manager` label begins with our pid): other tests on the
/// shared dockerd start containers of the image too.
fn containers_of_image() -> Vec<String> {
    let out = std::process::Command::new("docker")
        .env("DOCKER_HOST", env("DOCKER_HOST"))
        .args([
            "ps",
            "-a",
            "--filter",
            &format!("ancestor={}", env("CELLHOST_TEST_DOCKER_IMAGE")),
            "--format",
            "{{.ID}} {{.Label \"cellhost.manager\"}}",
        ])
        .output()
        .unwrap();
    let ours = format!("{}-", std::process::id());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (id, label) = l.split_once(' ')?;
            label.starts_with(&ours).then(|| id.to_owned())
        })
        .collect()
}

#[tokio::test]
async fn a_docker_kernel_keeps_state_between_cells() {
    let m = remote_manager("ctr", docker(), |o| o).await;
    let a = m.run("s", "x = 41; print('in a container')").await;
    assert_eq!(a.status, Status::Success, "{a:?}");
    assert_eq!(a.stdout, "in a container\n");
    assert_eq!(a.kernel.backend, "ctr");
    let b = m.run("s", "x + 1").await;
    assert_eq!(b.value.as_deref(), Some("42"));
    assert!(b.kernel.reused && b.kernel.pid == a.kernel.pid);
    let pid = a.kernel.pid.unwrap();
    assert!(alive_via(in_container, pid));
    m.manager.shutdown().await;
    assert!(
        !alive_via(in_container, pid),
        "shutdown kills the runner in the container"
    );
}

#[tokio::test]
async fn a_docker_cell_timeout_interrupts_and_a_dead_runner_is_reported() {
    let m = remote_manager("ctr", docker(), |o| o).await;
    m.run("s", "x = 7").await;
    let cell = Cell::new("import time\nwhile True: time.sleep(0.05)").timeout(SHORT);
    let r = m.manager.execute("s", cell).await.unwrap();
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert!(!r.kernel.state_lost);
    let r = m.run("s", "x").await;
    assert_eq!(r.value.as_deref(), Some("7"));
    let pid = r.kernel.pid.unwrap();
    in_container(&format!("kill -9 {pid}"));
    let r = m.run("s", "'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(r.kernel.state_lost, "{:?}", r.kernel);
    m.manager.shutdown().await;
}

#[tokio::test]
async fn an_image_backend_gives_each_kernel_its_own_container_and_a_restart_loses_state() {
    let m = remote_manager("img", docker_image(), |o| o).await;
    let r = m.run("s", "x = 1").await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let ids = containers_of_image();
    assert_eq!(ids.len(), 1, "one container for the kernel: {ids:?}");
    let label = std::process::Command::new("docker")
        .env("DOCKER_HOST", env("DOCKER_HOST"))
        .args([
            "inspect",
            "-f",
            "{{index .Config.Labels \"cellhost.manager\"}}",
            &ids[0],
        ])
        .output()
        .unwrap();
    let label = String::from_utf8_lossy(&label.stdout).trim().to_owned();
    assert!(!label.is_empty(), "labelled with its manager");
    let out = std::process::Command::new("docker")
        .env("DOCKER_HOST", env("DOCKER_HOST"))
        .args(["restart", "-t", "0", &ids[0]])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let r = m.run("s", "'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"), "{r:?}");
    assert!(
        r.kernel.state_lost,
        "a container restart is reported: {:?}",
        r.kernel
    );
    // Its workspace volume goes with the session (else it outlives the daemon).
    m.manager.dispose_owner("s").await;
    m.manager.shutdown().await;
    assert!(
        containers_of_image().is_empty(),
        "the kernel's container is removed"
    );
}

#[tokio::test]
async fn the_kubectl_exec_contract_holds_through_a_stand_in_client() {
    let dir = tempfile::tempdir().unwrap();
    let m = remote_manager("pod", kubectl_standin(dir.path()), |o| {
        let k = o.kernel.clone().interrupt_grace(Duration::from_millis(500));
        o.kernel(k)
    })
    .await;
    let a = m.run("s", "x = 2; print('via kubectl')").await;
    assert_eq!(a.stdout, "via kubectl\n", "{a:?}");
    assert_eq!(a.kernel.backend, "pod");
    let b = m.run("s", "x * 21").await;
    assert_eq!(b.value.as_deref(), Some("42"));
    let r = m
        .manager
        .execute(
            "s",
            Cell::new("import time\nwhile True: time.sleep(0.05)").timeout(SHORT),
        )
        .await
        .unwrap();
    assert_eq!(r.status, Status::Timeout);
    assert_eq!(m.run("s", "x").await.value.as_deref(), Some("2"));
    let pid = b.kernel.pid.unwrap();
    m.manager.shutdown().await;
    assert!(!alive_via(in_container, pid));
}
