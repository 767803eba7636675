//! The death-pipe watcher: a tiny `/bin/sh` that holds the read end of a
//! pipe whose write end only the host has, and SIGKILLs a process group
//! when the pipe closes (the host dropped its end or died by any means,
//! even SIGKILL). Kernels and the MCP downstream servers both use it.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt as _;
use std::process::Stdio;

/// Start the watcher of group `pgid` on `read` (the pipe's read end): it
/// blocks reading and SIGKILLs the group at EOF. It has its own session,
/// so a terminal's Ctrl-C never reaches it. Kill it first on a normal
/// stop, so it can never signal a group id reused later.
///
/// # Errors
/// `/bin/sh` could not be started.
pub fn watch_group(pgid: u32, read: OwnedFd) -> io::Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.args(["-c", "read -r _; kill -KILL \"-$0\"", &pgid.to_string()])
        .env_clear()
        .stdin(Stdio::from(read))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    // SAFETY: child_setup only calls async-signal-safe functions.
    unsafe {
        cmd.as_std_mut().pre_exec(|| super::unix::child_setup(&[]));
    }
    cmd.spawn()
}
