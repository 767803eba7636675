//! A kernel process's leader as the host waits on it: a child this host
//! spawned, or a process forked from another kernel's runner
//! (`kernel/fork.rs`), whose parent is that runner. The host watches a
//! forked one through a pidfd: it sees the exit, not the status (the
//! source runner reaps it, between its requests; init, once the source
//! is gone), unless the fork tells it: a strict template's fork has its
//! namespace's init write the runner's wait status on a pipe of the
//! host's (`sandbox/rehome.rs`).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;

pub(crate) enum Leader {
    Spawned(tokio::process::Child),
    Forked {
        pidfd: AsyncFd<OwnedFd>,
        /// The status pipe's read end, and what was read of it.
        told: Option<(std::fs::File, String)>,
    },
}

impl Leader {
    /// A pidfd on `pid`, a process this host did not spawn.
    ///
    /// # Errors
    /// The process is gone, or the kernel has no pidfds (Linux < 5.3).
    pub(crate) fn forked(pid: u32) -> io::Result<Leader> {
        let fd = crate::sys::pidfd_open(pid)?;
        // SAFETY: the fd is ours and stays open while registered (it is
        // the registration's own).
        let registered =
            unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
        Ok(Leader::Forked {
            pidfd: registered.map_err(|e| e.into_parts().1)?,
            told: None,
        })
    }

    /// A forked leader whose fork writes how it ended on `pipe` (the read
    /// end; made non-blocking here).
    pub(crate) fn told_by(mut self, pipe: OwnedFd) -> io::Result<Leader> {
        nix::fcntl::fcntl(
            &pipe,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )?;
        if let Leader::Forked { told, .. } = &mut self {
            *told = Some((std::fs::File::from(pipe), String::new()));
        }
        Ok(self)
    }

    /// What the fork has told so far (its status, or why its sandbox
    /// could not be made).
    pub(crate) fn told(&mut self) -> crate::sandbox::rehome::Told {
        let Leader::Forked {
            told: Some((pipe, text)),
            ..
        } = self
        else {
            return Default::default();
        };
        let mut buf = [0u8; 4096];
        while text.len() < 64 << 10 {
            match std::io::Read::read(pipe, &mut buf) {
                Ok(n) if n > 0 => text.push_str(&String::from_utf8_lossy(&buf[..n])),
                _ => break,
            }
        }
        crate::sandbox::rehome::Told::parse(text)
    }

    /// Resolves when the leader has exited, with its status where that is
    /// ours to read. Cancel safe. `None`: a forked one's that it did not
    /// tell (its source runner's to collect), or a wait that failed.
    pub(crate) async fn wait(&mut self) -> Option<ExitStatus> {
        match self {
            Leader::Spawned(child) => child.wait().await.ok(),
            Leader::Forked { pidfd, .. } => {
                let _ = pidfd.readable().await;
                // (Its init wrote before it exited, and the leader exits
                // after its init.)
                use std::os::unix::process::ExitStatusExt;
                self.told().status.map(ExitStatus::from_raw)
            }
        }
    }

    /// Whether the leader's pid (and so its process group's id) is still
    /// held, by the process or its zombie: signalling the group cannot
    /// reach a stranger. A spawned child is reaped only by us.
    pub(crate) fn holds_pid(&self) -> bool {
        match self {
            Leader::Spawned(_) => true,
            // Signal 0 through the pidfd checks existence.
            Leader::Forked { pidfd, .. } => {
                crate::sys::pidfd_signal(pidfd.get_ref().as_fd(), 0).is_ok()
            }
        }
    }
}
