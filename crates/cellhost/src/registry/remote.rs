//! The registry's side of remote kernels: which backend a cell runs on,
//! and starting a kernel there. Everything backend-specific lives in
//! [`crate::remote`].

use super::key::{KernelKey, KernelSpec};
use super::options::ManagerOptions;
use crate::kernel::{Kernel, SpawnError};
use crate::remote::{Backends, Placement};

/// The manager's backends; ssh control sockets go under its runtime dir.
pub(super) fn backends(opts: &ManagerOptions) -> Backends {
    let runtime = opts.kernel.staging_root.parent().unwrap_or(&opts.data_dir);
    // The data dir names this manager's workspaces on remote hosts: the
    // same after a restart, another manager's never.
    let scope = crate::remote::short_hash(&opts.data_dir.display().to_string());
    Backends::new(&opts.backends, &crate::remote::ssh_dir(runtime)).with_workspaces(scope)
}

/// The backend `owner`'s workspace lives on: its session's default, else
/// the manager's; `None` for the local one.
pub(super) fn workspace_backend(
    opts: &ManagerOptions,
    backends: &Backends,
    owner: &str,
) -> Option<String> {
    backends
        .session_default(owner)
        .or_else(|| opts.default_backend.clone())
        .filter(|b| b != "local")
}

/// The key of `owner`'s cell: its backend is the spec's, else the
/// session's default, else the manager's, else `"local"` (and the spec
/// inside the key names none, so one kernel has one key).
pub(super) fn key_for(
    opts: &ManagerOptions,
    backends: &Backends,
    owner: &str,
    spec: &KernelSpec,
) -> KernelKey {
    let mut spec = spec.clone();
    let backend = spec
        .backend
        .take()
        .or_else(|| backends.session_default(owner))
        .or_else(|| opts.default_backend.clone())
        .unwrap_or_else(|| "local".to_owned());
    KernelKey {
        owner: owner.to_owned(),
        backend,
        spec,
    }
}

/// Start a kernel for `key` on its (remote) backend.
pub(super) async fn spawn(
    opts: &ManagerOptions,
    backends: &Backends,
    key: &KernelKey,
) -> Result<Kernel, SpawnError> {
    let placement = Placement {
        owner: &key.owner,
        python: key.spec.python.as_deref(),
        cwd: key.spec.cwd.as_deref(),
        kernel: opts.kernel.clone(),
        idle_timeout: opts.idle_timeout,
    };
    backends.spawn(&key.backend, placement).await
}
