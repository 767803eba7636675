# cellhost kernel runner: the strict profile in a fork of a warm template
# (docs/templates.md, "Strict kernels"). Loaded by a strict template at
# start (before any fork), so every fork has it compiled.
#
# A strict template runs as root in a bubblewrap sandbox of its own (the
# read-only system dirs, the built /etc), with only the capabilities this
# file needs (CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID, CAP_SETPCAP and, for
# forks with a network namespace of their own, CAP_NET_ADMIN) in its
# effective and bounding sets, no_new_privs, no seccomp filter and no
# Landlock domain, and runs no cell (harden(), at its start). Each fork is
# made a sandboxed kernel of its own here, in two steps:
#
# split(): once the host has moved the fork (C1, in the host's pid
#   namespace) into its cgroup. C1 unshares the mount, pid, ipc, uts,
#   cgroup and (network off) net namespaces and forks C2, the new pid
#   namespace's init. C2 makes its mounts private, mounts a fresh /proc,
#   /tmp, /dev/shm and /dev/pts over its template's (detached first),
#   names the host, brings lo up, forks C3 (the kernel to be, pid 2) and
#   drops to an unprivileged uid with no capabilities; it then reaps until
#   C3 is gone, writes C3's wait status to the host's status pipe and
#   exits as C3 did. C1 waits for C2 and exits the same way. The host sees
#   what it sees of bwrap: a leader, an init, the runner.
# seal(): in C3, when the host hands the kernel over. Its staging dir,
#   workspace and package dir (detached mounts the host made, read-only
#   where a spawned kernel's are) are moved over the template's; then the
#   groups, gid and uid are dropped to the session's, the bounding,
#   ambient and inheritable capability sets emptied, no_new_privs set, the
#   Landlock ruleset enforced and the seccomp programs loaded: what bwrap
#   and setpriv do to a spawned kernel before its Python starts. Anything
#   that fails kills the fork (fail closed); the host then spawns plainly.
#
# Stdlib only (ctypes). The numbers of the syscalls libc may not wrap
# (move_mount, landlock_restrict_self) come from the host, which has them
# for its architecture.

import ctypes
import fcntl
import os
import signal
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2
AT_FDCWD = -100
MOVE_MOUNT_F_EMPTY_PATH = 0x4
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
LINUX_CAPABILITY_VERSION_3 = 0x20080522
INIT_UID = 65534  # C2, the namespace's init, runs as nobody

_libc = ctypes.CDLL(None, use_errno=True)
_libc.unshare.argtypes = [ctypes.c_int]
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.capset.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
_libc.syscall.restype = ctypes.c_long


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _ok(r, what):
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))
    return r


def _prctl(option, a=0, b=0):
    return _ok(_libc.prctl(option, a, b, 0, 0), "prctl(%d)" % option)


def _detach(target):
    # What the template had mounted there goes (a fork sees only its own).
    if _libc.umount2(target.encode(), MNT_DETACH) < 0:
        e = ctypes.get_errno()
        if e not in (22, 2):  # EINVAL: not a mount point; ENOENT
            raise OSError(e, "umount %s: %s" % (target, os.strerror(e)))


def _mount(source, target, fstype, flags, data=None):
    _detach(target)
    _ok(
        _libc.mount(source.encode(), target.encode(), fstype.encode(), flags, data and data.encode()),
        "mount %s on %s" % (fstype, target),
    )


def _report(status_fd, line):
    try:
        os.write(status_fd, (line.replace("\n", " ")[:2000] + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def _exit_as(status):
    # A child's wait status as this process's exit: the code, or 128 + the
    # signal (bwrap's convention; the host reads the status pipe instead).
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _close_all_but(keep):
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 256))
    for fd in fds:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def harden():
    """In the template, at its start (before the preload imports): its
    bounding set down to the capabilities it holds, and no_new_privs, so
    nothing it or a module it imports executes gets more (bwrap drops a
    root sandbox's effective set, not its bounding set)."""
    held = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                held = int(line.split()[1], 16)
    for cap in range(_last_cap() + 1):
        if not held >> cap & 1:
            _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def _last_cap():
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


def split(cfg, status_fd):
    """In C1: returns only in C3 (the kernel to be); C1 and C2 never
    return. `cfg` is the host's: {"net": unshare the network, "tmp_bytes":
    size of /tmp and /dev/shm or None}."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
    if cfg.get("net"):
        flags |= CLONE_NEWNET
    try:
        _ok(_libc.unshare(flags), "unshare")
        c2 = os.fork()
    except BaseException as e:
        _report(status_fd, "error: the fork's namespaces: %s" % (e,))
        os._exit(70)
    if c2:
        # C1: the leader the host watches; exits as C2 does.
        _close_all_but(())
        while True:
            try:
                _, status = os.waitpid(c2, 0)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                os._exit(1)
        _exit_as(status)
    try:
        c3 = _init_setup(cfg, status_fd)
    except BaseException as e:
        _report(status_fd, "error: the fork's sandbox: %s" % (e,))
        os._exit(70)
    if c3 == 0:
        return  # C3
    _close_all_but((status_fd,))
    try:
        os.chdir("/")  # not the template's workspace
        _drop(INIT_UID, INIT_UID)
    except BaseException as e:
        _report(status_fd, "error: the fork's init could not drop its privileges: %s" % (e,))
        os._exit(70)
    _reap(c3, status_fd)


def _init_setup(cfg, status_fd):
    # C2, pid 1 of the new namespace, still root with the template's
    # capabilities.
    _prctl(PR_SET_PDEATHSIG, 9)  # dies with C1
    _ok(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make the mounts private")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    size = cfg.get("tmp_bytes")
    for tmp in ("/tmp", "/dev/shm"):
        data = "mode=1777" + (",size=%d" % size if size else "")
        _mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, data)
    _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
    name = b"cellhost"
    _ok(_libc.sethostname(name, len(name)), "sethostname")
    if cfg.get("net"):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", IFF_UP))
        finally:
            s.close()
    c3 = os.fork()
    if c3 == 0:
        # (It keeps the status pipe until it is sealed, to say why not.)
        _prctl(PR_SET_PDEATHSIG, 9)
    return c3


def _reap(c3, status_fd):
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(1)
        if pid == c3:
            _report(status_fd, "status %d" % status)
            _exit_as(status)


def _drop(uid, gid):
    """Drop to `uid`:`gid` for good: no groups, no capabilities in any
    set, an empty bounding set, no_new_privs (setpriv's --clear-groups
    --inh-caps=-all --bounding-set=-all --no-new-privs)."""
    if uid == 0 or gid == 0:
        raise OSError("a kernel never runs as root")
    for cap in range(_last_cap() + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    header = struct.pack("Ii", LINUX_CAPABILITY_VERSION_3, 0)
    data = bytes(24)  # two {effective, permitted, inheritable}, all empty
    hbuf = ctypes.create_string_buffer(header, len(header))
    dbuf = ctypes.create_string_buffer(data, len(data))
    _ok(_libc.capset(hbuf, dbuf), "capset")
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    # Checked, not assumed: a set left non-empty fails the fork.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")):
                if int(line.split()[1], 16) != 0:
                    raise OSError("%s is not empty after the drop" % line.split(":")[0])
            elif line.startswith("NoNewPrivs") and line.split()[1] != "1":
                raise OSError("no_new_privs is not set")
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise OSError("the uid, gid or groups did not change")


def seal(spec, fds):
    """In C3, at the hand-over: `spec` is the host's {"uid", "gid",
    "mounts": [[target, index in fds]], "landlock": index or None,
    "seccomp": [hex of each program], "sys": {name: syscall number}};
    `fds` the descriptors sent with it."""
    nr = spec["sys"]
    os.chdir("/")  # not the template's workspace, which goes now
    for target, i in spec["mounts"]:
        _detach(target)
        _ok(
            _libc.syscall(
                ctypes.c_long(nr["move_mount"]),
                ctypes.c_long(fds[i]),
                ctypes.c_char_p(b""),
                ctypes.c_long(AT_FDCWD),
                ctypes.c_char_p(target.encode()),
                ctypes.c_long(MOVE_MOUNT_F_EMPTY_PATH),
            ),
            "move the mount to %s" % target,
        )
    _drop(spec["uid"], spec["gid"])
    # As after an exec (a spawned kernel's): its /proc entries are its own.
    _prctl(PR_SET_DUMPABLE, 1)
    ll = spec.get("landlock")
    if ll is not None:
        _ok(
            _libc.syscall(ctypes.c_long(nr["landlock_restrict_self"]), ctypes.c_long(fds[ll]), ctypes.c_long(0)),
            "landlock_restrict_self",
        )
    for fd in fds:
        os.close(fd)
    for program in spec["seccomp"]:
        raw = bytes.fromhex(program)
        buf = ctypes.create_string_buffer(raw, len(raw))
        prog = _SockFprog(len(raw) // 8, ctypes.addressof(buf))
        _ok(
            _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0),
            "load a seccomp program",
        )
