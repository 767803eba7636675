//! `[backends.NAME]`: where remote kernels run (see [`crate::remote`]).
//!
//! ```toml
//! default_backend = "box"          # optional; "local" when absent
//!
//! [backends.box]
//! kind = "ssh"
//! hosts = ["10.0.0.5", "10.0.0.6"] # or host = "…"; several = a fleet
//! user = "agent"
//! identity = "/home/me/.ssh/id_ed25519"
//!
//! [backends.sandbox]
//! kind = "docker"
//! image = "python:3.12-slim"       # or container = "name-or-id"
//!
//! [backends.pod]
//! kind = "kubectl"
//! pod = "worker-0"
//! namespace = "agents"
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Settings every remote backend shares (each section carries these keys
/// itself: serde's `flatten` cannot be combined with unknown-key errors).
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteCommon {
    /// Interpreter on the remote side (default `python3`).
    pub python: String,
    /// Parent of the kernel dirs on the remote side (default: the remote
    /// `$TMPDIR`, else `/tmp`).
    pub tmpdir: Option<String>,
    /// How long a runner may take to start (default 30 s).
    pub spawn_timeout_seconds: f64,
    /// An idle runner exits by itself after this long (default: the
    /// manager's `idle_timeout`, else 1800 s).
    pub idle_exit_seconds: Option<u64>,
    /// How long a transport command may take beyond the cell's own
    /// timeout before the connection counts as dead (default 30 s).
    pub transport_timeout_seconds: f64,
}

impl Default for RemoteCommon {
    fn default() -> Self {
        RemoteCommon {
            python: "python3".into(),
            tmpdir: None,
            spawn_timeout_seconds: 30.0,
            idle_exit_seconds: None,
            transport_timeout_seconds: 30.0,
        }
    }
}

impl RemoteCommon {
    /// [`spawn_timeout_seconds`](RemoteCommon#structfield.spawn_timeout_seconds)
    /// as a `Duration` (negative counts as zero).
    pub fn spawn_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.spawn_timeout_seconds.max(0.0))
    }

    /// [`transport_timeout_seconds`](RemoteCommon#structfield.transport_timeout_seconds)
    /// as a `Duration` (at least 0.1 s).
    pub fn transport_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.transport_timeout_seconds.max(0.1))
    }
}

/// `kind = "ssh"`: OpenSSH with one multiplexed connection per host.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct SshConfig {
    /// One host (or use `hosts`).
    pub host: Option<String>,
    /// Several hosts: a fleet. New owners go to the least-loaded host.
    pub hosts: Vec<String>,
    /// Remote login user (`ssh -l`; default: ssh's own, from its config or
    /// the local user).
    pub user: Option<String>,
    /// Remote sshd port (`ssh -p`; default: ssh's own, normally 22).
    pub port: Option<u16>,
    /// Private key file (`ssh -i`).
    pub identity: Option<PathBuf>,
    /// known_hosts file (default: cellhost's own, under its runtime dir,
    /// with `StrictHostKeyChecking=accept-new`).
    pub known_hosts: Option<PathBuf>,
    /// `StrictHostKeyChecking` (default `accept-new`).
    pub strict_host_key_checking: Option<String>,
    /// The ssh client (default `ssh` on PATH).
    pub ssh: Option<PathBuf>,
    /// Seconds between keepalives; 3 unanswered ones drop the connection
    /// (default 5).
    pub keepalive_seconds: Option<u64>,
    /// `ConnectTimeout` (default 10).
    pub connect_timeout_seconds: Option<u64>,
    /// `python`, `tmpdir`, timeouts: see [`RemoteCommon`].
    pub python: Option<String>,
    /// Parent of the kernel dirs on the remote side (see
    /// [`RemoteCommon::tmpdir`]).
    pub tmpdir: Option<String>,
    /// Seconds a runner may take to start (default 30).
    pub spawn_timeout_seconds: Option<f64>,
    /// Seconds after which an idle runner exits by itself (see
    /// [`RemoteCommon::idle_exit_seconds`]).
    pub idle_exit_seconds: Option<u64>,
    /// Seconds a transport command may take beyond the cell's timeout
    /// (default 30).
    pub transport_timeout_seconds: Option<f64>,
}

impl SshConfig {
    /// Every host, `host` first.
    pub fn all_hosts(&self) -> Vec<String> {
        let mut all: Vec<String> = self.host.iter().cloned().collect();
        all.extend(
            self.hosts
                .iter()
                .filter(|h| Some(*h) != self.host.as_ref())
                .cloned(),
        );
        all
    }
}

/// `kind = "docker"`: `docker exec -i` into a container.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct DockerConfig {
    /// An existing, running container (name or id).
    pub container: Option<String>,
    /// Or an image: one container per kernel, removed with it (the
    /// session's files live in a docker volume mounted in each).
    pub image: Option<String>,
    /// Extra `docker run` arguments in image mode, for kernel and file-op
    /// containers (default: `--network none`).
    pub run_args: Option<Vec<String>>,
    /// `docker exec -u`.
    pub user: Option<String>,
    /// The docker client (default `docker` on PATH).
    pub docker: Option<PathBuf>,
    /// `DOCKER_HOST` for the client (default: inherited).
    pub docker_host: Option<String>,
    /// `python`, `tmpdir`, timeouts: see [`RemoteCommon`].
    pub python: Option<String>,
    /// Parent of the kernel dirs on the remote side (see
    /// [`RemoteCommon::tmpdir`]).
    pub tmpdir: Option<String>,
    /// Seconds a runner may take to start (default 30).
    pub spawn_timeout_seconds: Option<f64>,
    /// Seconds after which an idle runner exits by itself (see
    /// [`RemoteCommon::idle_exit_seconds`]).
    pub idle_exit_seconds: Option<u64>,
    /// Seconds a transport command may take beyond the cell's timeout
    /// (default 30).
    pub transport_timeout_seconds: Option<f64>,
}

/// `kind = "kubectl"`: `kubectl exec -i POD`.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct KubectlConfig {
    /// The pod kernels run in (it must exist and have Python).
    pub pod: String,
    /// `kubectl -n` (default: the context's namespace).
    pub namespace: Option<String>,
    /// `kubectl exec -c`, for a pod of several containers (default: its
    /// default container).
    pub container: Option<String>,
    /// `kubectl --context` (default: the current context).
    pub context: Option<String>,
    /// The kubectl client (default `kubectl` on PATH).
    pub kubectl: Option<PathBuf>,
    /// `python`, `tmpdir`, timeouts: see [`RemoteCommon`].
    pub python: Option<String>,
    /// Parent of the kernel dirs on the remote side (see
    /// [`RemoteCommon::tmpdir`]).
    pub tmpdir: Option<String>,
    /// Seconds a runner may take to start (default 30).
    pub spawn_timeout_seconds: Option<f64>,
    /// Seconds after which an idle runner exits by itself (see
    /// [`RemoteCommon::idle_exit_seconds`]).
    pub idle_exit_seconds: Option<u64>,
    /// Seconds a transport command may take beyond the cell's timeout
    /// (default 30).
    pub transport_timeout_seconds: Option<f64>,
}

/// One `[backends.NAME]` section.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum BackendConfig {
    /// `kind = "ssh"`.
    Ssh(SshConfig),
    /// `kind = "docker"`.
    Docker(DockerConfig),
    /// `kind = "kubectl"`.
    Kubectl(KubectlConfig),
}

macro_rules! common_of {
    ($c:expr) => {{
        let d = RemoteCommon::default();
        RemoteCommon {
            python: $c.python.clone().unwrap_or(d.python),
            tmpdir: $c.tmpdir.clone(),
            spawn_timeout_seconds: $c.spawn_timeout_seconds.unwrap_or(d.spawn_timeout_seconds),
            idle_exit_seconds: $c.idle_exit_seconds,
            transport_timeout_seconds: $c
                .transport_timeout_seconds
                .unwrap_or(d.transport_timeout_seconds),
        }
    }};
}

impl BackendConfig {
    /// The section's shared settings, with defaults for the keys it omits.
    pub fn common(&self) -> RemoteCommon {
        match self {
            BackendConfig::Ssh(c) => common_of!(c),
            BackendConfig::Docker(c) => common_of!(c),
            BackendConfig::Kubectl(c) => common_of!(c),
        }
    }

    /// Checks what serde cannot; the message names the section.
    pub fn validate(&self, name: &str) -> Result<(), String> {
        if name == "local" || name.is_empty() {
            return Err(format!(
                "[backends.{name}]: the name {name:?} is reserved; pick another name"
            ));
        }
        let c = self.common();
        if c.python.trim().is_empty() {
            return Err(format!("[backends.{name}]: python must not be empty"));
        }
        if !c.spawn_timeout_seconds.is_finite() || !c.transport_timeout_seconds.is_finite() {
            return Err(format!(
                "[backends.{name}]: timeouts must be finite numbers"
            ));
        }
        // A value starting with `-` would reach ssh/docker/kubectl as an
        // option (`-oProxyCommand=…` runs a local command).
        let mut values: Vec<(&str, String)> = Vec::new();
        match self {
            BackendConfig::Ssh(s) => {
                values.extend(s.all_hosts().into_iter().map(|h| ("host", h)));
                values.extend(s.user.iter().map(|u| ("user", u.clone())));
            }
            BackendConfig::Docker(d) => {
                values.extend(d.container.iter().map(|c| ("container", c.clone())));
                values.extend(d.image.iter().map(|c| ("image", c.clone())));
                values.extend(d.user.iter().map(|u| ("user", u.clone())));
            }
            BackendConfig::Kubectl(k) => values.push(("pod", k.pod.clone())),
        }
        if let Some((key, v)) = values.iter().find(|(_, v)| v.starts_with('-')) {
            return Err(format!(
                "[backends.{name}]: {key} = {v:?} starts with '-', which the client would take as an option; fix the value"
            ));
        }
        match self {
            BackendConfig::Ssh(s) if s.all_hosts().is_empty() => Err(format!(
                "[backends.{name}]: kind = \"ssh\" needs host = \"…\" or hosts = [\"…\"]"
            )),
            BackendConfig::Docker(d) if d.container.is_some() == d.image.is_some() => {
                Err(format!(
                    "[backends.{name}]: kind = \"docker\" needs exactly one of container = \"…\" or image = \"…\""
                ))
            }
            BackendConfig::Kubectl(k) if k.pod.is_empty() => Err(format!(
                "[backends.{name}]: kind = \"kubectl\" needs pod = \"…\""
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::path::Path;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("cellhost.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn every_kind_parses_with_defaults() {
        let c = parse(
            "default_backend = \"box\"\n[backends.box]\nkind = \"ssh\"\nhosts = [\"a\", \"b\"]\nuser = \"u\"\nport = 2222\n\
             [backends.d]\nkind = \"docker\"\nimage = \"img\"\n\
             [backends.k]\nkind = \"kubectl\"\npod = \"p\"\nnamespace = \"ns\"\n",
        )
        .unwrap();
        assert_eq!(c.default_backend.as_deref(), Some("box"));
        let BackendConfig::Ssh(s) = &c.backends["box"] else {
            panic!("ssh expected")
        };
        assert_eq!(s.all_hosts(), ["a", "b"]);
        assert_eq!(c.backends["box"].common().python, "python3");
        assert!(matches!(c.backends["d"], BackendConfig::Docker(_)));
        assert!(matches!(c.backends["k"], BackendConfig::Kubectl(_)));
    }

    #[test]
    fn mistakes_are_errors_that_say_what_to_do() {
        let e = parse("[backends.b]\nkind = \"ssh\"\n").unwrap_err();
        assert!(e.contains("needs host"), "{e}");
        let e =
            parse("[backends.b]\nkind = \"ssh\"\nhost = \"h\"\nhostname = \"x\"\n").unwrap_err();
        assert!(e.contains("hostname"), "{e}");
        let e = parse("[backends.b]\nkind = \"docker\"\n").unwrap_err();
        assert!(e.contains("exactly one of container"), "{e}");
        let e = parse("[backends.b]\nkind = \"telnet\"\n").unwrap_err();
        assert!(e.contains("telnet"), "{e}");
        let e = parse("[backends.local]\nkind = \"kubectl\"\npod = \"p\"\n").unwrap_err();
        assert!(e.contains("reserved"), "{e}");
        let e = parse("[backends.b]\nkind = \"ssh\"\nhost = \"-oProxyCommand=touch /tmp/x\"\n")
            .unwrap_err();
        assert!(e.contains("starts with '-'"), "{e}");
        let e = parse("[backends.b]\nkind = \"ssh\"\nhost = \"h\"\nuser = \"-x\"\n").unwrap_err();
        assert!(e.contains("user"), "{e}");
        let e = parse("default_backend = \"nope\"\n").unwrap_err();
        assert!(e.contains("nope") && e.contains("[backends.nope]"), "{e}");
    }
}
