//! Unix plumbing: pipes, fd placement in the child, process-group signals.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// A pipe whose both ends are close-on-exec in this process, so a kernel
/// spawned later never inherits another kernel's ends.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)
}

/// Called in the forked child before exec (async-signal-safe calls only):
/// start a new session (own process group, no controlling terminal), then
/// place each `(src, dst)` fd at `dst` without CLOEXEC. Sources are first
/// moved above any target so that `dup2` never clobbers a source.
pub(crate) fn child_setup(fds: &[(RawFd, RawFd)]) -> io::Result<()> {
    // SAFETY: setsid/fcntl/dup2 are async-signal-safe and only touch fds we own.
    unsafe {
        if libc::setsid() < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut moved = [0 as RawFd; 8];
        assert!(fds.len() <= moved.len());
        for (i, (src, _)) in fds.iter().enumerate() {
            let fd = libc::fcntl(*src, libc::F_DUPFD_CLOEXEC, 64);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            moved[i] = fd;
        }
        for (i, (_, dst)) in fds.iter().enumerate() {
            if libc::dup2(moved[i], *dst) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // Nothing else crosses exec: an fd the host inherited without
        // CLOEXEC (a shell's `exec 9</`) would hand a sandboxed kernel the
        // host's filesystem. CLOEXEC rather than close, so fds still needed
        // until exec (Landlock's ruleset) stay usable.
        let first = fds.iter().map(|(_, dst)| *dst).max().unwrap_or(2) + 1;
        cloexec_from(first);
    }
    Ok(())
}

/// Mark every fd >= `first` close-on-exec (async-signal-safe).
///
/// # Safety
/// Only in a forked child before exec.
unsafe fn cloexec_from(first: RawFd) {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range only changes fd flags of this process.
    let done = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    } == 0;
    if done {
        return;
    }
    // Kernels before 5.11: flag each possible fd up to the soft limit.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into `lim`; fcntl on a closed fd fails harmlessly.
    unsafe {
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur.min(1 << 20) as RawFd
        } else {
            4096
        };
        for fd in first..max {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
}

/// Send `sig` to every process in group `pgid`. A group that is already
/// gone is not an error.
pub(crate) fn signal_group(pgid: u32, sig: Signal) {
    let _ = killpg(Pid::from_raw(pgid as i32), sig);
}

/// Send `sig` to one process.
pub(crate) fn signal_pid(pid: u32, sig: Signal) {
    let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), sig);
}

/// A pidfd on `pid`: it names that process, and never one that takes its
/// pid after it was reaped.
///
/// # Errors
/// The process is gone, or the kernel has no pidfds (Linux < 5.3).
pub(crate) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; it returns a new fd.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd that nothing else owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd) })
}

/// Send signal number `sig` (0: only check it lives) through `pidfd`.
///
/// # Errors
/// The process has exited (ESRCH), or the signal was refused.
pub(crate) fn pidfd_signal(pidfd: std::os::fd::BorrowedFd<'_>, sig: i32) -> io::Result<()> {
    // SAFETY: a pidfd we borrow, a signal number, no siginfo, no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `true` when `pid` names a live process (not a zombie).
pub fn pid_alive(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|f| is_running(&f))
}

/// The state letter (field 3) says the process has not exited.
fn is_running(fields: &[String]) -> bool {
    !matches!(
        fields.first().and_then(|s| s.chars().next()),
        Some('Z') | Some('X') | None
    )
}

/// Resident set size of `pid` in bytes, from /proc.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A readable name for a signal number, e.g. `SIGKILL`.
pub(crate) fn signal_name(sig: i32) -> String {
    Signal::try_from(sig)
        .map(|s| s.as_str().to_owned())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

pub(crate) fn raw(fd: &OwnedFd) -> RawFd {
    fd.as_raw_fd()
}

/// Fields of `/proc/<pid>/stat` after the command name (which may hold
/// spaces and parentheses): index 0 is the state letter (field 3).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// The parent of `pid` (`stat` field 4), if `pid` lives.
pub fn parent_pid(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// The children of `pid` (none when it is gone).
pub fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|k| k.parse().ok())
        .collect()
}

/// Every live descendant of `pid` (children, grandchildren, ...).
pub fn descendants(pid: u32) -> Vec<u32> {
    let (mut out, mut todo) = (Vec::new(), vec![pid]);
    while let Some(p) = todo.pop() {
        let kids = children(p);
        todo.extend(&kids);
        out.extend(kids);
    }
    out
}

/// When `pid` started, in clock ticks since boot (`stat` field 22). With
/// the pid it names one process: a pid reused later has a later start.
pub fn process_start_time(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// The start time of `pid` if it is alive, from one read of `stat`.
pub(crate) fn live_start_time(pid: u32) -> Option<u64> {
    let fields = stat_fields(pid)?;
    if !is_running(&fields) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// The process group of `pid` (`stat` field 5).
pub fn process_group(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(2)?.parse().ok()
}
