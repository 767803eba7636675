//! Helpers for the remote-kernel tests: backends on the real sshd, netns
//! host and dockerd that scripts/test starts (scripts/testenv-up). Tests
//! fail, never skip, when that environment is missing.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cellhost::config::{BackendConfig, DockerConfig, KubectlConfig, SshConfig};
use cellhost::registry::{KernelManager, KernelSpec, ManagerOptions};
use cellhost::{Cell, CellResult};

use super::registry::{manager_options, TestManager};

/// A variable exported by scripts/testenv-up.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: the remote-kernel tests need the real sshd, netns host and dockerd; \
             run scripts/test (it starts them with scripts/testenv-up and tears them down after)"
        )
    })
}

pub fn ssh_config(hosts: &[&str]) -> SshConfig {
    SshConfig {
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        user: Some(env("CELLHOST_TEST_SSH_USER")),
        port: Some(env("CELLHOST_TEST_SSH_PORT").parse().unwrap()),
        identity: Some(env("CELLHOST_TEST_SSH_KEY").into()),
        keepalive_seconds: Some(1),
        connect_timeout_seconds: Some(3),
        ..SshConfig::default()
    }
}

/// The sshd on 127.0.0.1.
pub fn ssh() -> BackendConfig {
    BackendConfig::Ssh(ssh_config(&[&env("CELLHOST_TEST_SSH_HOST")]))
}

/// Both ssh hosts: a fleet.
pub fn fleet() -> BackendConfig {
    BackendConfig::Ssh(ssh_config(&[
        &env("CELLHOST_TEST_SSH_HOST"),
        &env("CELLHOST_TEST_SSH_HOST2"),
    ]))
}

/// The shared test container.
pub fn docker() -> BackendConfig {
    BackendConfig::Docker(DockerConfig {
        container: Some(env("CELLHOST_TEST_DOCKER_CONTAINER")),
        docker_host: Some(env("DOCKER_HOST")),
        ..DockerConfig::default()
    })
}

/// A container per kernel from the offline image.
pub fn docker_image() -> BackendConfig {
    BackendConfig::Docker(DockerConfig {
        image: Some(env("CELLHOST_TEST_DOCKER_IMAGE")),
        run_args: Some(
            [
                "--network",
                "none",
                "-v",
                "/usr:/usr:ro",
                "-v",
                "/etc:/etc:ro",
            ]
            .map(String::from)
            .to_vec(),
        ),
        docker_host: Some(env("DOCKER_HOST")),
        ..DockerConfig::default()
    })
}

/// kubectl through a stand-in client that forwards `kubectl exec -i POD
/// … -- CMD` to `docker exec -i POD CMD` (no cluster exists here).
pub fn kubectl_standin(dir: &Path) -> BackendConfig {
    let path = dir.join("kubectl");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n# stand-in: kubectl exec -i POD [-c C] [-n NS] [--context X] -- CMD...\n\
             [ \"$1\" = exec ] && [ \"$2\" = -i ] || {{ echo \"stand-in: unsupported: $*\" >&2; exit 2; }}\n\
             pod=$3; shift 3\n\
             while [ \"$1\" != -- ]; do shift 2; done; shift\n\
             DOCKER_HOST={} exec docker exec -i \"$pod\" \"$@\"\n",
            env("DOCKER_HOST")
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    BackendConfig::Kubectl(KubectlConfig {
        pod: env("CELLHOST_TEST_DOCKER_CONTAINER"),
        namespace: Some("agents".into()),
        kubectl: Some(path),
        ..KubectlConfig::default()
    })
}

/// A manager whose default backend is `name` = `backend`.
pub async fn remote_manager(
    name: &str,
    backend: BackendConfig,
    f: impl FnOnce(ManagerOptions) -> ManagerOptions,
) -> TestManager {
    let dir = tempfile::tempdir().unwrap();
    let opts = manager_options(&dir)
        .backend(name, backend)
        .default_backend(name);
    let manager = KernelManager::start(f(opts)).await;
    TestManager { manager, dir }
}

pub async fn run_spec(m: &KernelManager, owner: &str, spec: &KernelSpec, cell: Cell) -> CellResult {
    m.execute_with(owner, spec, cell).await.expect("execute")
}

/// Run `script` on the ssh test host directly (not through cellhost).
pub fn ssh_sh(host: &str, script: &str) -> String {
    let out = Command::new("ssh")
        .args([
            "-p",
            &env("CELLHOST_TEST_SSH_PORT"),
            "-i",
            &env("CELLHOST_TEST_SSH_KEY"),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "ConnectTimeout=5",
            &format!("{}@{host}", env("CELLHOST_TEST_SSH_USER")),
            script,
        ])
        .output()
        .expect("run ssh");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run `script` in the test container directly.
pub fn docker_sh(container: &str, script: &str) -> String {
    let out = Command::new("docker")
        .env("DOCKER_HOST", env("DOCKER_HOST"))
        .args(["exec", "-i", container, "sh", "-c", script])
        .output()
        .expect("run docker");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `true` when `pid` runs on the far side (`kill -0` there). The far side
/// always answers `yes` or `no`; anything else (ssh or docker itself
/// failed) panics, so `!alive_via(…)` never passes because the check
/// could not run.
pub fn alive_via(sh: impl Fn(&str) -> String, pid: u32) -> bool {
    let s = format!(
        "if kill -0 {pid} 2>/dev/null && ! grep -q '^State:.*Z' /proc/{pid}/status; then echo yes; else echo no; fi"
    );
    match sh(&s).trim() {
        "yes" => true,
        "no" => false,
        other => panic!("could not check pid {pid} on the far side (got {other:?})"),
    }
}

pub const SHORT: Duration = Duration::from_millis(800);
