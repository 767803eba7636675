//! Landlock as an extra layer under bubblewrap, where the kernel has it.
//!
//! The ruleset is built in the host (it allocates) and only enforced in
//! the forked child with one `landlock_restrict_self` syscall before bwrap
//! runs. It must not restrict the filesystem: Landlock forbids `mount(2)`
//! to any process whose domain handles filesystem access, and bwrap needs
//! mounts to build the sandbox (filesystem isolation is bwrap's mount
//! namespace plus the unprivileged uid). What it adds:
//!
//! - TCP `connect`/`bind` denied when the network is off (ABI 4+), on top
//!   of the empty network namespace;
//! - signals only to processes in the same sandbox, and no connecting to
//!   abstract Unix sockets created outside it (ABI 6+ scopes).
//!
//! Best effort: on an older kernel (or none) whatever is unsupported is
//! dropped silently, and bwrap's namespaces still hold.

use std::os::fd::{AsRawFd, OwnedFd};

use ::landlock::{Access, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr, Scope, ABI};

/// A created ruleset, to be enforced in the child.
#[derive(Debug)]
pub(crate) struct Prepared {
    fd: OwnedFd,
}

/// Build the ruleset; `None` when the kernel supports none of it.
pub(crate) fn prepare(network: bool) -> Option<Prepared> {
    let mut ruleset = Ruleset::default().set_compatibility(CompatLevel::BestEffort);
    if !network {
        ruleset = ruleset.handle_access(AccessNet::from_all(ABI::V4)).ok()?;
    }
    let ruleset = ruleset
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .ok()?;
    let created = ruleset.create().ok()?;
    let fd: Option<OwnedFd> = created.into();
    fd.map(|fd| Prepared {
        fd: above_placements(fd),
    })
}

/// The ruleset's fd moved to 64 or above. The child places its pipes and
/// the seccomp/block fds at small numbers (`sys::child_setup`) before it
/// enforces the ruleset; a ruleset that happened to get one of those
/// numbers (a process whose low fds were free) was overwritten there, and
/// the spawn failed with EBADFD ("not a ruleset").
fn above_placements(fd: OwnedFd) -> OwnedFd {
    // SAFETY: fcntl on an fd we own; the duplicate is a fresh fd we then own.
    let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 64) };
    if high < 0 {
        return fd;
    }
    // SAFETY: `high` was just returned by fcntl and nothing else owns it.
    unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(high) }
}

impl Prepared {
    pub(crate) fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// The ruleset's fd, to be sent to a process that enforces it itself
    /// (a strict template's fork, `runner/strictfork.py`).
    pub(crate) fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

/// In the forked child (async-signal-safe: one syscall). The host runs as
/// root here (CAP_SYS_ADMIN), or `no_new_privs` is set first otherwise.
pub(crate) fn enforce(fd: i32) -> std::io::Result<()> {
    // SAFETY: plain syscalls with integer arguments.
    unsafe {
        if libc::geteuid() != 0 && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::syscall(libc::SYS_landlock_restrict_self, fd, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
