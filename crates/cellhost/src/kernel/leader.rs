//! A kernel process's leader as the host waits on it: a child this host
//! spawned, or a process forked from another kernel's runner
//! (`kernel/fork.rs`), whose parent is that runner. The host watches a
//! forked one through a pidfd: it sees the exit, never the status (the
//! source runner reaps it, between its requests; init, once the source
//! is gone).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;

pub(crate) enum Leader {
    Spawned(tokio::process::Child),
    Forked(AsyncFd<OwnedFd>),
}

impl Leader {
    /// A pidfd on `pid`, a process this host did not spawn.
    ///
    /// # Errors
    /// The process is gone, or the kernel has no pidfds (Linux < 5.3).
    pub(crate) fn forked(pid: u32) -> io::Result<Leader> {
        // SAFETY: pidfd_open takes a pid and flags; it returns a new fd.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // SAFETY: the fd is ours and stays open while registered (it is
        // the registration's own).
        let registered =
            unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
        Ok(Leader::Forked(registered.map_err(|e| e.into_parts().1)?))
    }

    /// Resolves when the leader has exited, with its status where that is
    /// ours to read. Cancel safe. `None`: a forked one's (its source
    /// runner's to collect), or a wait that failed.
    pub(crate) async fn wait(&mut self) -> Option<ExitStatus> {
        match self {
            Leader::Spawned(child) => child.wait().await.ok(),
            Leader::Forked(fd) => {
                let _ = fd.readable().await;
                None
            }
        }
    }

    /// Whether the leader's pid (and so its process group's id) is still
    /// held, by the process or its zombie: signalling the group cannot
    /// reach a stranger. A spawned child is reaped only by us.
    pub(crate) fn holds_pid(&self) -> bool {
        match self {
            Leader::Spawned(_) => true,
            Leader::Forked(fd) => {
                // SAFETY: signal 0 through a pidfd we own checks existence.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        fd.get_ref().as_raw_fd(),
                        0,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    )
                };
                r == 0
            }
        }
    }
}
