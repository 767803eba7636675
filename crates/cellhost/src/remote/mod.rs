//! Remote kernels: session kernels on hosts reached only through
//! run-to-completion exec (ssh, docker exec, kubectl exec), and fleets of
//! ssh hosts.
//!
//! A remote kernel is an ordinary [`Kernel`] handle whose actor
//! (`kernel.rs`) drives a detached runner on the far side through files
//! in a private kernel dir, one exec per cell. So the registry's caps,
//! idle reaping, busy-skip, children and disposal apply unchanged.
//!
//! `transport.rs` is the exec abstraction; `ssh.rs`, `docker.rs` and
//! `kubectl.rs` its three clients; `script.rs` the remote commands;
//! `result.rs` the result blob and the output pipeline; `fleet.rs`
//! placement on several hosts; `files.rs` the session's remote workspace
//! and `dockervol.rs` its docker volume in image mode. [`Backends`]
//! holds the configured backends of one manager.

mod docker;
mod dockervol;
mod files;
mod fleet;
mod kernel;
mod kubectl;
mod result;
mod script;
mod ssh;
mod transport;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use docker::DockerTransport;
pub use files::{RemoteReader, RemoteWorkspace};
pub use fleet::{Fleet, Lease};
pub use kubectl::KubectlTransport;
pub use ssh::SshTransport;
pub use transport::{shell_quote, ExecError, ExecOutput, Transport};

use crate::config::BackendConfig;
use crate::kernel::{Kernel, KernelOptions, SpawnError};

/// Stable short hex name for file names (FNV-1a, 64 bits).
pub fn short_hash(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[derive(Debug)]
enum Backend {
    Ssh {
        config: BackendConfig,
        hosts: Vec<Arc<SshTransport>>,
        fleet: Arc<Fleet>,
    },
    Docker(BackendConfig),
    Kubectl(BackendConfig, Arc<KubectlTransport>),
}

/// The configured remote backends of one manager, by name, and each
/// session's default backend. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Backends {
    map: Arc<BTreeMap<String, Backend>>,
    sessions: Arc<Mutex<HashMap<String, String>>>,
    /// This manager's id, the `cellhost.manager` label of the containers
    /// it starts (removed at shutdown if a kernel left one).
    manager: String,
    /// Names this manager's workspaces on the remote side (stable across
    /// restarts: a hash of its data dir), so two managers sharing a host
    /// never share a session's files. `None`: remote kernels get no
    /// workspace (their cwd is the spec's, else the login dir).
    scope: Option<String>,
    /// Image-mode docker workspace volumes made by this manager.
    volumes: dockervol::Made,
}

/// A backend name that is not configured.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown backend {name:?}: add a [backends.{name}] section to cellhost.toml or use \"local\" (configured: {known})")]
pub struct UnknownBackend {
    name: String,
    known: String,
}

/// What a remote kernel is started with besides its backend.
pub(crate) struct Placement<'a> {
    pub owner: &'a str,
    pub python: Option<&'a Path>,
    pub cwd: Option<&'a Path>,
    pub kernel: KernelOptions,
    /// The manager's idle timeout: the runner exits by itself after it.
    pub idle_timeout: Option<Duration>,
}

impl Backends {
    /// Backends from `[backends.*]`; ssh control sockets and known_hosts
    /// go in `ssh_dir` (created 0700 on first use).
    pub fn new(config: &BTreeMap<String, BackendConfig>, ssh_dir: &Path) -> Backends {
        let map = config
            .iter()
            .map(|(name, c)| {
                let b = match c {
                    BackendConfig::Ssh(s) => {
                        let hosts = s.all_hosts();
                        Backend::Ssh {
                            hosts: hosts
                                .iter()
                                .map(|h| Arc::new(SshTransport::new(s, h, ssh_dir)))
                                .collect(),
                            fleet: Fleet::new(hosts),
                            config: c.clone(),
                        }
                    }
                    BackendConfig::Docker(_) => Backend::Docker(c.clone()),
                    BackendConfig::Kubectl(k) => {
                        Backend::Kubectl(c.clone(), Arc::new(KubectlTransport::new(k)))
                    }
                };
                (name.clone(), b)
            })
            .collect();
        let _ = crate::sys::private_dir(ssh_dir);
        Backends {
            map: Arc::new(map),
            sessions: Arc::default(),
            manager: format!("{}-{}", std::process::id(), crate::sys::random_hex(6)),
            scope: None,
            volumes: dockervol::Made::default(),
        }
    }

    /// Give remote kernels per-session workspaces named under `scope`.
    pub(crate) fn with_workspaces(mut self, scope: String) -> Backends {
        self.scope = Some(scope);
        self
    }

    /// `owner`'s workspace on backend `name` (on a fleet: the host its
    /// session is pinned to, pinned now to where a new kernel would go
    /// when it has none; in image mode: the session's docker volume).
    /// `None` when the backend is not configured or workspaces are off.
    pub fn workspace(
        &self,
        name: &str,
        owner: &str,
        quota: Option<u64>,
    ) -> Option<RemoteWorkspace> {
        let scope = self.scope.as_deref()?;
        let backend = self.map.get(name)?;
        let mut base = None;
        let (config, transport): (&BackendConfig, Arc<dyn Transport>) = match backend {
            // A library-built config with no host (the config file's
            // check refuses one): no workspace, as for no backend.
            Backend::Ssh { hosts, .. } if hosts.is_empty() => return None,
            Backend::Ssh {
                config,
                hosts,
                fleet,
            } => (config, hosts[fleet.pin(owner)].clone()),
            Backend::Kubectl(config, t) => (config, t.clone()),
            Backend::Docker(config @ BackendConfig::Docker(d)) => match &d.container {
                Some(c) => (config, Arc::new(DockerTransport::existing_of(d, c))),
                None => {
                    // Image mode: the session's volume, through a kernel
                    // container that is up or a short-lived one
                    // (dockervol.rs).
                    base = Some(dockervol::MOUNT.to_owned());
                    let t = dockervol::VolumeTransport::new(
                        d,
                        self.volumes.clone(),
                        scope,
                        owner,
                        &self.manager,
                        config.common().transport_timeout(),
                    );
                    (config, Arc::new(t))
                }
            },
            Backend::Docker(_) => return None,
        };
        let common = config.common();
        Some(RemoteWorkspace::new(
            transport,
            common.python.clone(),
            base.or_else(|| common.tmpdir.clone()),
            files::key_of(scope, owner),
            quota,
            common.transport_timeout(),
        ))
    }

    /// Remove `owner`'s remote workspace and its children's on backend
    /// `name` (best effort: an unreachable host keeps them).
    pub(crate) async fn drop_workspace(&self, name: &str, owner: &str) {
        let Some(scope) = self.scope.as_deref() else {
            return;
        };
        if let Some(Backend::Docker(BackendConfig::Docker(d))) = self.map.get(name) {
            if d.container.is_none() && crate::owner::session_of(owner) == owner {
                // Image mode: the session's volume holds just its files.
                dockervol::remove(d, &self.volumes, &dockervol::volume_name(scope, owner)).await;
                return;
            }
        }
        if let Some(ws) = self.workspace(name, owner, None) {
            ws.drop_home(&files::home_key(scope, owner)).await;
        }
        if let Some(Backend::Ssh { fleet, .. }) = self.map.get(name) {
            if crate::owner::session_of(owner) == owner {
                fleet.unpin(owner);
            }
        }
    }

    /// Make `name` the backend of `session`'s cells (and its delegated
    /// children's) whose spec names none; `None` goes back to the
    /// manager's default. A cell's own `backend` still wins.
    ///
    /// # Errors
    /// [`UnknownBackend`] when `name` is neither `"local"` nor configured.
    pub fn set_session_default(
        &self,
        session: &str,
        name: Option<&str>,
    ) -> Result<(), UnknownBackend> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        match name {
            None => {
                sessions.remove(session);
            }
            Some(n) if n == "local" || self.map.contains_key(n) => {
                sessions.insert(session.to_owned(), n.to_owned());
            }
            Some(n) => {
                return Err(UnknownBackend {
                    name: n.to_owned(),
                    known: self.names().join(", "),
                })
            }
        }
        Ok(())
    }

    /// The default backend of `owner`'s session, if one was set.
    pub fn session_default(&self, owner: &str) -> Option<String> {
        let session = crate::owner::session_of(owner);
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.get(session).cloned()
    }

    /// The configured backend names, sorted (`"local"` is not one).
    pub fn names(&self) -> Vec<String> {
        self.map.keys().cloned().collect()
    }

    /// `name` is a configured backend (`false` for `"local"`).
    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// `(host, live kernels)` of an ssh backend's hosts.
    pub fn host_loads(&self, backend: &str) -> Vec<(String, usize)> {
        match self.map.get(backend) {
            Some(Backend::Ssh { fleet, .. }) => fleet.loads(),
            _ => Vec::new(),
        }
    }

    /// The ssh host `owner`'s kernels on `backend` run on, while it has any.
    pub fn host_of(&self, backend: &str, owner: &str) -> Option<String> {
        match self.map.get(backend) {
            Some(Backend::Ssh { fleet, .. }) => fleet.host_of(owner),
            _ => None,
        }
    }

    /// Start a kernel of `p.owner` on backend `name`.
    pub(crate) async fn spawn(&self, name: &str, p: Placement<'_>) -> Result<Kernel, SpawnError> {
        let err = |detail: String| SpawnError::Remote {
            backend: name.to_owned(),
            detail,
        };
        let Some(backend) = self.map.get(name) else {
            let known = self.names();
            return Err(err(format!(
                "no such backend; add a [backends.{name}] section to cellhost.toml (configured: {})",
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            )));
        };
        let config = match backend {
            Backend::Ssh { config, .. } | Backend::Docker(config) | Backend::Kubectl(config, _) => {
                config
            }
        };
        let mut common = config.common();
        if let Some(py) = p.python {
            common.python = py.display().to_string();
        }
        let idle = common
            .idle_exit_seconds
            .map(Duration::from_secs)
            .or(p.idle_timeout)
            .unwrap_or(Duration::from_secs(1800));
        let options = |transport: Arc<dyn Transport>,
                       owns_transport: bool,
                       lease: Option<Lease>,
                       ws: Option<(String, RemoteWorkspace)>| {
            let (cwd, workspace) = ws.unzip();
            kernel::RemoteKernelOptions {
                backend: name.to_owned(),
                transport,
                owns_transport,
                common: common.clone(),
                idle_exit: idle,
                cwd: p.cwd.map(|c| c.display().to_string()).or(cwd),
                workspace,
                kernel: p.kernel.clone(),
                lease,
            }
        };
        // The session's workspace on the remote side, made before the
        // runner starts in it (its cwd), unless the spec names a cwd.
        let workspace_of = |t: &Arc<dyn Transport>, base: Option<&str>| {
            let scope = self.scope.clone();
            let t = t.clone();
            let python = common.python.clone();
            let tmpdir = base.map(str::to_owned).or_else(|| common.tmpdir.clone());
            let timeout = common.transport_timeout();
            let policy = files::policy_json(&p.kernel.packages.policy);
            async move {
                let Some(scope) = scope.filter(|_| p.cwd.is_none()) else {
                    return Ok(None);
                };
                let ws = RemoteWorkspace::new(
                    t,
                    python,
                    tmpdir,
                    files::key_of(&scope, p.owner),
                    None,
                    timeout,
                );
                ws.make_root(Some(policy))
                    .await
                    .map(|root| Some((root, ws)))
                    .map_err(|e| {
                        format!(
                            "could not make the session's workspace under the remote temp dir ({}); check the backend's tmpdir, its python and disk space",
                            crate::error_chain(&e)
                        )
                    })
            }
        };
        match backend {
            Backend::Ssh { hosts, .. } if hosts.is_empty() => Err(err(
                "the ssh backend names no host; set `host` or `hosts` in its [backends.*] table"
                    .into(),
            )),
            Backend::Ssh { hosts, fleet, .. } => {
                // A host that fails to connect or ship is put in backoff
                // and the kernel tries the next healthy host (each once).
                let mut tried = vec![false; hosts.len()];
                loop {
                    let lease = fleet.place(p.owner);
                    let host = lease.host;
                    tried[host] = true;
                    let t: Arc<dyn Transport> = hosts[host].clone();
                    let started = match workspace_of(&t, None).await {
                        Ok(cwd) => kernel::spawn(options(t, false, Some(lease), cwd)).await,
                        Err(e) => {
                            // Released before the next placement: a
                            // lease keeps its owner on this host.
                            drop(lease);
                            Err(err(e))
                        }
                    };
                    match started {
                        Ok(k) => {
                            fleet.succeeded(host);
                            return Ok(k);
                        }
                        Err(e) => {
                            fleet.failed(host);
                            let next = fleet.peek(p.owner);
                            if tried[next] {
                                return Err(e);
                            }
                        }
                    }
                }
            }
            Backend::Docker(BackendConfig::Docker(d)) => {
                let owns = d.container.is_none();
                // Image mode: the container goes with the kernel, the
                // session's workspace volume stays (dockervol.rs).
                let volume = match (&self.scope, owns) {
                    (Some(scope), true) => {
                        let v = dockervol::volume_name(scope, p.owner);
                        let timeout = common.transport_timeout();
                        dockervol::ensure(d, &self.volumes, scope, &v, timeout)
                            .await
                            .map_err(|e| err(e.to_string()))?;
                        Some(v)
                    }
                    _ => None,
                };
                let mut t = DockerTransport::connect(
                    d,
                    common.transport_timeout(),
                    &self.manager,
                    volume.as_deref(),
                )
                .await
                .map_err(|e| err(e.to_string()))?;
                if let Some(v) = &volume {
                    t.track(self.volumes.clone(), v.clone());
                }
                let t: Arc<dyn Transport> = Arc::new(t);
                let base = volume.as_ref().map(|_| dockervol::MOUNT);
                let ws = if owns && volume.is_none() {
                    None
                } else {
                    workspace_of(&t, base).await.map_err(err)?
                };
                kernel::spawn(options(t, owns, None, ws)).await
            }
            Backend::Docker(c) => Err(err(format!("misconfigured backend {c:?}"))),
            Backend::Kubectl(_, t) => {
                let t: Arc<dyn Transport> = t.clone();
                let cwd = workspace_of(&t, None).await.map_err(err)?;
                kernel::spawn(options(t, false, None, cwd)).await
            }
        }
    }

    /// Stop the ssh masters and remove any container this manager started
    /// that a kernel left behind. Kernels must be shut down first.
    pub async fn shutdown(&self) {
        for b in self.map.values() {
            match b {
                Backend::Ssh { hosts, .. } => {
                    for h in hosts {
                        h.shutdown().await;
                    }
                }
                Backend::Docker(BackendConfig::Docker(d)) if d.image.is_some() => {
                    docker::remove_labelled(d, &self.manager).await;
                }
                _ => {}
            }
        }
    }
}

/// Where a manager keeps its ssh control sockets.
pub fn ssh_dir(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("ssh")
}
