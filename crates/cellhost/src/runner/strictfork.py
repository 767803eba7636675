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
#   drops to nobody with no capabilities; it then reaps until C3 is gone,
#   writes C3's wait status on the host's status pipe and exits as C3 did.
#   C3 empties its bounding and ambient capability sets, enforces the
#   Landlock ruleset the host sent with the go and loads the seccomp
#   programs sent with it: the kernel's filter (what bwrap loads for a
#   spawned kernel) but for umount2 and move_mount, which seal() denies
#   with one more small program once its own mounts are in place (the host
#   checks that the parts together decide every call as the kernel's
#   filter does; loading the big program costs ~0.2 ms, off the hand-over
#   this way). C1 waits for C2 and exits
#   as it does, as nobody with no capabilities: the host sees what it sees
#   of bwrap (a leader, an init, the runner).
# seal(): in C3, at the hand-over. Its staging dir, workspace and package
#   dir (detached mounts the host made, read-only where a spawned
#   kernel's are) are moved over its template's; then its groups, gid and
#   uid are dropped to the session's, its capability sets emptied, and the
#   last seccomp program loaded.
#
# Anything that fails kills the fork (fail closed) and is said on the
# status pipe; the host then spawns plainly. Stdlib only (ctypes). The
# numbers of the syscalls libc may not wrap (move_mount,
# landlock_restrict_self) come from the host, which has them for its
# architecture.

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
# Made once, in the template: a fork's first use of ctypes costs.
_CAP_HEADER = ctypes.create_string_buffer(struct.pack("Ii", LINUX_CAPABILITY_VERSION_3, 0), 8)
_CAP_NONE = ctypes.create_string_buffer(24)  # two {effective, permitted, inheritable}
_CAP_SETS = (b"CapInh:", b"CapPrm:", b"CapEff:", b"CapBnd:", b"CapAmb:")

_sealed = []  # C3's last seccomp program, ready to load (seal())
_nr = {}  # syscall numbers from the host


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


def _name(name):
    # What ps shows: a strict fork's leader and init are `cellhost-sbx` (a
    # spawned kernel's are `bwrap`), not the template they were forked from.
    try:
        fd = os.open("/proc/self/comm", os.O_WRONLY)
        try:
            os.write(fd, name)
        finally:
            os.close(fd)
    except OSError:
        pass


def _status_lines():
    fd = os.open("/proc/self/status", os.O_RDONLY)
    try:
        return os.read(fd, 1 << 16).splitlines()
    finally:
        os.close(fd)


def _last_cap():
    try:
        fd = os.open("/proc/sys/kernel/cap_last_cap", os.O_RDONLY)
        try:
            return int(os.read(fd, 64))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return 63


# Read once, in the template: a fork's /proc may be a pid namespace's
# where it is not (its leader's, while its init remounts it).
_LAST_CAP = _last_cap()


def harden():
    """In the template, at its start (before the preload imports): its
    bounding set down to the capabilities it holds, and no_new_privs, so
    nothing it or a module it imports executes gets more (bwrap drops a
    root sandbox's effective set, not its bounding set)."""
    held = 0
    for line in _status_lines():
        if line.startswith(b"CapEff:"):
            held = int(line.split()[1], 16)
    for cap in range(_LAST_CAP + 1):
        if not held >> cap & 1:
            _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def _empty_bounding_set():
    # Its effective capabilities stay until the drop (the bounding set
    # only limits what an exec could gain).
    for cap in range(_LAST_CAP + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)


def split(cfg, status_fd, landlock_fd):
    """In C1: returns only in C3 (the kernel to be); C1 and C2 never
    return. `cfg` is the host's: {"net": unshare the network, "tmp_bytes":
    size of /tmp and /dev/shm or None, "seccomp": [hex of each program],
    "sys": {name: syscall number}}; `landlock_fd` its ruleset, or None."""
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
        # C1: the leader the host watches; exits as C2 does. It needs no
        # privilege for that: nobody, no capabilities. (Its /proc is being
        # remounted by C2 for C2's pid namespace, where C1 is not: the drop
        # is checked through the calls, not /proc/self.)
        _name(b"cellhost-sbx")
        try:
            _empty_bounding_set()
            _drop(INIT_UID, INIT_UID, verify=False)
        except BaseException as e:
            _report(status_fd, "error: the fork's leader could not drop its privileges: %s" % (e,))
            os._exit(70)
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
        _init_setup(cfg)
        c3 = os.fork()
    except BaseException as e:
        _report(status_fd, "error: the fork's sandbox: %s" % (e,))
        os._exit(70)
    if c3 == 0:
        _prctl(PR_SET_PDEATHSIG, 9)
        _confine(cfg, landlock_fd)
        return  # C3: it keeps the status pipe until it is sealed, to say why not
    _close_all_but((status_fd,))
    try:
        os.chdir("/")  # not the template's workspace
        _empty_bounding_set()
        _drop(INIT_UID, INIT_UID)
    except BaseException as e:
        _report(status_fd, "error: the fork's init could not drop its privileges: %s" % (e,))
        os._exit(70)
    _reap(c3, status_fd)


def _init_setup(cfg):
    # C2, pid 1 of the new namespace, still root with the template's
    # capabilities.
    _prctl(PR_SET_PDEATHSIG, 9)  # dies with C1
    _name(b"cellhost-sbx")
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


def _confine(cfg, landlock_fd):
    # C3, before it waits: what bwrap and setpriv do but the mounts, the
    # uid and the last part of the filter, seal()'s.
    global _sealed, _nr
    try:
        _empty_bounding_set()
        _nr = cfg["sys"]
        if landlock_fd is not None:
            _ok(
                _libc.syscall(
                    ctypes.c_long(_nr["landlock_restrict_self"]),
                    ctypes.c_long(landlock_fd),
                    ctypes.c_long(0),
                ),
                "landlock_restrict_self",
            )
            os.close(landlock_fd)
        for _, prog in _programs(cfg.get("seccomp", ())):
            _load(prog)
        _sealed = _programs(cfg.get("sealed", ()))  # ready to load at the seal
    except BaseException as e:
        raise OSError("the kernel's confinement: %s" % (e,))


def _programs(hexes):
    # Each program's buffer and the struct pointing at it.
    out = []
    for program in hexes:
        raw = bytes.fromhex(program)
        buf = ctypes.create_string_buffer(raw, len(raw))
        out.append((buf, _SockFprog(len(raw) // 8, ctypes.addressof(buf))))
    return out


def _load(prog):
    _ok(
        _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0),
        "load a seccomp program",
    )


def rehearse():
    """In C3 (a spare) before it waits: seal()'s paths once, so what they
    touch faults in now (see the runner's _rehearse). Changes nothing but
    its supplementary groups, which the drop empties anyway: a move_mount
    of no fd fails with EBADF, a missing dir is not detached."""
    _status_lines()
    os.setgroups([])
    os.getresuid(), os.getresgid(), os.getgroups()
    _prctl(PR_SET_NO_NEW_PRIVS, 1)  # set already: the ctypes call path
    _detach("/run/cellhost/no-such-dir")
    _move_mount(-1, "/run/cellhost/no-such-dir", check=False)


def _move_mount(fd, target, check=True):
    r = _libc.syscall(
        ctypes.c_long(_nr["move_mount"]),
        ctypes.c_long(fd),
        ctypes.c_char_p(b""),
        ctypes.c_long(AT_FDCWD),
        ctypes.c_char_p(target.encode()),
        ctypes.c_long(MOVE_MOUNT_F_EMPTY_PATH),
    )
    if check:
        _ok(r, "move the mount to %s" % target)


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


def _drop(uid, gid, verify=True):
    """Drop to `uid`:`gid` for good: no groups, no capabilities in any
    set (the bounding and ambient sets are empty already), no_new_privs
    (setpriv's --clear-groups --inh-caps=-all --bounding-set=-all
    --no-new-privs); `verify`: each set read back from /proc/self/status."""
    if uid == 0 or gid == 0:
        raise OSError("a kernel never runs as root")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _ok(_libc.capset(_CAP_HEADER, _CAP_NONE), "capset")
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise OSError("the uid, gid or groups did not change")
    if not verify:
        return
    # Checked, not assumed: a set left non-empty fails the fork.
    for line in _status_lines():
        if line.startswith(_CAP_SETS):
            if int(line.split()[1], 16) != 0:
                raise OSError("%s is not empty after the drop" % line.split(b":")[0].decode())
        elif line.startswith(b"NoNewPrivs:") and line.split()[1] != b"1":
            raise OSError("no_new_privs is not set")


def seal(spec, fds):
    """In C3, at the hand-over: `spec` is the host's {"uid", "gid",
    "mounts": [[target, index in fds]]}; `fds` the descriptors sent with
    it (closed here)."""
    os.chdir("/")  # not the template's workspace, which goes now
    for target, i in spec["mounts"]:
        _detach(target)
        _move_mount(fds[i], target)
    for fd in fds:
        os.close(fd)
    _drop(spec["uid"], spec["gid"])
    # As after an exec (a spawned kernel's): its /proc entries are its own.
    _prctl(PR_SET_DUMPABLE, 1)
    for _, prog in _sealed:
        _load(prog)
