//! Start one downstream MCP server as a child process and initialize an
//! MCP client session with it.
//!
//! The server runs in its own process group. A tiny `/bin/sh` watcher
//! holds the read end of a pipe whose write end only this process has: if
//! cellhost dies by any means (even SIGKILL) the pipe closes and the
//! watcher kills the server's whole group, so no server (or its children)
//! outlives the host. The watcher is killed first on a normal stop.

use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::time::Duration;

use cellhost::config::McpServerConfig;
use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;

/// A connected server plus the guard that kills its group with the host.
pub(crate) struct Running {
    pub service: RunningService<RoleClient, ()>,
    pub guard: DeathGuard,
}

impl Running {
    pub(crate) fn peer(&self) -> &rmcp::service::Peer<RoleClient> {
        self.service.peer()
    }
}

/// Start and initialize `config`'s server within its `start_timeout`.
pub(crate) async fn connect(config: &McpServerConfig) -> Result<Running, String> {
    let mut cmd = tokio::process::Command::new(&config.command);
    cmd.args(&config.args)
        .envs(&config.env)
        .stderr(Stdio::inherit());
    if let Some(dir) = &config.cwd {
        cmd.current_dir(dir);
    }
    let mut wrapped = CommandWrap::from(cmd);
    wrapped.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
    let transport = TokioChildProcess::new(wrapped).map_err(|e| {
        format!(
            "cannot start {:?}: {e}; check command (is it installed and on PATH?)",
            config.command
        )
    })?;
    let guard = transport
        .id()
        .map(DeathGuard::new)
        .unwrap_or_else(|| Ok(DeathGuard::none()))
        .map_err(|e| format!("cannot start its watcher: {e}"))?;
    let limit = Duration::from_secs_f64(config.start_timeout);
    let service = match tokio::time::timeout(limit, ().serve(transport)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return Err(format!(
                "it did not complete the MCP handshake: {e}; check that {:?} starts an MCP \
                 server on stdio",
                config.command
            ))
        }
        Err(_) => {
            return Err(format!(
                "it did not complete the MCP handshake within {} s (start_timeout)",
                config.start_timeout
            ))
        }
    };
    Ok(Running { service, guard })
}

/// Kills the server's process group when cellhost dies (see the module
/// docs); dropping it stops the watcher without killing anything.
pub(crate) struct DeathGuard {
    watcher: Option<tokio::process::Child>,
    _write: Option<OwnedFd>,
}

impl DeathGuard {
    fn none() -> DeathGuard {
        DeathGuard {
            watcher: None,
            _write: None,
        }
    }

    fn new(pgid: u32) -> std::io::Result<DeathGuard> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let watcher = cellhost::sys::watch_group(pgid, read)?;
        Ok(DeathGuard {
            watcher: Some(watcher),
            _write: Some(write),
        })
    }
}

impl DeathGuard {
    /// Kill the server's whole group now (a normal stop): close the pipe
    /// and let the watcher do it. Call it while the group's leader is
    /// still unreaped, so its id cannot belong to another group.
    pub(crate) async fn kill_group(mut self) {
        drop(self._write.take());
        if let Some(mut w) = self.watcher.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), w.wait()).await;
        }
    }
}

impl Drop for DeathGuard {
    fn drop(&mut self) {
        // The watcher first: it must never signal a reused group id.
        if let Some(mut w) = self.watcher.take() {
            let _ = w.start_kill();
        }
    }
}
