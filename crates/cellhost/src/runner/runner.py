# cellhost kernel runner, part 7 of 7 (compile.py, limits.py, helpers.py,
# warmup.py, frames.py and streams.py come first in the shipped script).
# Stdlib only, Python >= 3.8.
#
# The host starts this script with:
#   fd 0  /dev/null            (input() fails fast)
#   fd 1  stdout pipe          (every byte belongs to the running cell)
#   fd 2  stderr pipe
#   fd 3  control requests     (host -> runner, framed)
#   fd 4  control replies      (runner -> host, framed)
#   fd 5  death pipe           (EOF = the host is gone: kill our process group)
#
# Arguments: --display=MAX_DISPLAY,MAX_CELL_BYTES,MAX_CELL_DISPLAYS (the
# display caps). --cpu-per-cell=N moves the soft RLIMIT_CPU to "CPU used so far
# + N (+1 for whole-second rounding)" at the start of every cell, so a cell
# that burns more is killed by SIGXCPU (the host names the limit).
# --chdir=DIR: the cell's working dir (in a sandbox, where bwrap cannot).
# --packages=DIR: the session's package dir (what `%pip` installs), put on
# sys.path ahead of site-packages.
# --network=MODE: the kernel's network mode ("off", "allowlist", "host"),
# for the hints (hints.py).
#
# Requests and replies on fds 3/4 are frames (frames.py); the cell's fds
# 1/2 are kept usable across cells by streams.py.
#
# Startup imports are kept to builtin modules: json, re, traceback and
# friends cost milliseconds each and are imported lazily, only on the paths
# that need them (errors).
#
# Rich outputs (display(), rich last values, matplotlib figures) live in
# display.py next to this file, loaded on first use; see `_display_module`.
# Display frames (op=display) may be written at any time, from any thread
# (see `_send` in frames.py).

import sys
import os
import _signal
import _thread
import builtins
import io

CTRL_IN = 3
CTRL_OUT = 4
DEATH = 5
MAX_VALUE = 1 << 20  # bytes of a value repr sent to the host
# Display caps, from the host (--display=); the host enforces them again.
MAX_DISPLAY = 5 << 20
MAX_CELL_BYTES = 20 << 20
MAX_CELL_DISPLAYS = 1000

_runner_file = __file__
_cell_running = False
_cpu_per_cell = 0
_cpu_hard = None
_cpu_soft = None
_resource = None
_sources = {}  # filename -> source, pushed into linecache lazily
# The tool RPC token, from the env (removed there at start, so the cell's
# subprocesses never inherit it). See tools.py, sent with the first cell
# that has tools.
_tools_token = None
_packages_dir = None  # --packages=
_pip_remote = None  # a remote runner: {"policy", "dir", "here"}; pip runs in the kernel
_preload = []  # --preload=: imported before the hello
_warmup = False  # --warmup: warm the preloaded modules up too (see _warm_up)
_pipmagic_source = None  # pipmagic.py, read at start (see _PipMagicHook)
_egress_socket = None  # --egress=: the host's egress proxy socket
_strict_template = False  # --template=strict: forks are sandboxed by strictfork.py


def _watch_death():
    # Blocks in read() with the GIL released, so this fires even while a
    # cell spins. EOF means the host died by any means: take the whole
    # process group (the cell's children too) down with us.
    while True:
        try:
            if not os.read(DEATH, 64):
                break
        except InterruptedError:
            continue
        except OSError:
            return  # a cell closed the fd: we cannot watch any more
    try:
        for group in list(_shell_groups):  # `!cmd`s run in groups of their own
            try:
                os.killpg(group, 9)
            except OSError:
                pass
        os.killpg(0, 9)
    finally:
        os._exit(1)


def _on_sigint(signum, frame):
    # Only user code is interruptible: a SIGINT that lands while the runner
    # itself is between cells or writing a reply is ignored.
    global _sigint_deferred
    if _cell_running:
        if _main_writing:
            _sigint_deferred = True  # raised by _send once the frame is out
            return
        raise KeyboardInterrupt


# --- tool RPC: the generated `tools` module --------------------------------


import weakref as _weakref

_tools_modules = _weakref.WeakSet()  # every tools module made, for a fork to re-point


def _install_tools(req):
    # A new module object each time the tool set changes (a pooled kernel
    # adopted by an owner); a reference kept by a cell keeps working.
    # Returns False (and says why on stderr) when it could not be set up:
    # the host then sends it again with the next cell.
    try:
        source = req["tools"].decode("utf-8", "surrogateescape")
        mod = type(sys)("tools")
        mod.__file__ = "<cellhost tools>"
        mod._SOCKET = os.path.join(os.path.dirname(os.path.abspath(_runner_file)), "tools.sock")
        mod._TOKEN = _tools_token
        mod._MAX = int(req.get("tools_max", b"10485760"))
        why = req.get("tools_error")
        mod._UNAVAILABLE = why.decode("utf-8", "replace") if why is not None else None
        exec(compile(source, "<cellhost tools>", "exec"), mod.__dict__)
        sys.modules["tools"] = mod
        _tools_modules.add(mod)
        return True
    except Exception as e:
        print("cellhost: could not set up the tools module: %r" % (e,), file=sys.stderr)
        return False


# --- rich outputs: display.py, loaded on first use -------------------------

_modules = sys.modules
_display_source = None  # read at start: a cell may remove the staging dir
_display_mod = None


def _display_module():
    global _display_mod
    if _display_mod is None:
        path = os.path.join(os.path.dirname(_runner_file), "display.py")
        mod = type(sys)("_cellhost_display")
        mod.__file__ = path
        exec(compile(_display_source, path, "exec"), mod.__dict__)
        rt = type(sys)("_cellhost_runtime")
        rt.MAX_DISPLAY = MAX_DISPLAY
        rt.MAX_CELL_BYTES = MAX_CELL_BYTES
        rt.MAX_CELL_DISPLAYS = MAX_CELL_DISPLAYS
        rt._send = _send
        rt._order = _order
        rt._encode = _encode
        rt._thread = _thread
        mod.init(rt)
        _display_mod = mod
    return _display_mod


def display(*objs, **kwargs):
    """Show objects as rich outputs (images, HTML tables...) in the cell's result."""
    return _display_module().display(*objs, **kwargs)


_PLAIN_TYPES = frozenset(
    (int, float, complex, bool, str, bytes, list, tuple, dict, set, frozenset, range, type)
)
_RICH_METHODS = tuple(
    "_repr_mimebundle_ _repr_png_ _repr_jpeg_ _repr_svg_ _repr_html_ "
    "_repr_markdown_ _repr_json_ _repr_latex_".split()
)


def _maybe_rich(value):
    """Cheap test: may `value` have a representation beyond text?"""
    cls = type(value)
    if cls in _PLAIN_TYPES:
        return False
    for name in _RICH_METHODS:
        if getattr(cls, name, None) is not None:
            return True
    mod = getattr(cls, "__module__", None)
    return isinstance(mod, str) and mod.startswith(("matplotlib.", "PIL."))


class _MatplotlibHook:
    """A meta-path finder that prepares matplotlib as it is imported (no
    window, plt.show() captures figures; see display.py `find_spec`). It
    answers only for two names; any other import costs two compares."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "matplotlib.pyplot" and name != "matplotlib":
            return None
        return _display_module().find_spec(name, path, target, _MatplotlibHook)


class _PipMagicHook:
    """Makes `import pipmagic` (what `%pip` becomes) find the runner's
    pipmagic.py, with the tool socket, token and package dir set in it."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "pipmagic" or _pipmagic_source is None:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(name, _PipMagicHook, origin="<cellhost pipmagic>")

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(mod):
        here = os.path.dirname(os.path.abspath(_runner_file))
        mod._SOCKET = os.path.join(here, "tools.sock")
        mod._TOKEN = _tools_token
        mod._PATH = _packages_dir
        mod._REMOTE = _pip_remote
        exec(compile(_pipmagic_source, "<cellhost pipmagic>", "exec"), mod.__dict__)


def _start_egress_forwarder(sock_path):
    """network = "allowlist": the sandbox has only its own loopback. Listen
    on it and carry each connection to the host's egress proxy (a Unix
    socket); offer that port as the HTTP(S) proxy."""
    import socket

    lsn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsn.bind(("127.0.0.1", 0))
    lsn.listen(64)
    os.set_inheritable(lsn.fileno(), False)
    url = "http://127.0.0.1:%d" % lsn.getsockname()[1]
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        os.environ[var] = url
        os.environ[var.lower()] = url
    os.environ.pop("NO_PROXY", None)
    os.environ.pop("no_proxy", None)

    def pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (dst,):
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def serve(conn):
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(sock_path)
        except OSError:
            conn.close()
            up.close()
            return
        _thread.start_new_thread(pump, (conn, up))
        pump(up, conn)
        conn.close()
        up.close()

    def accept():
        while True:
            try:
                conn, _ = lsn.accept()
            except OSError:
                continue
            _thread.start_new_thread(serve, (conn,))

    _thread.start_new_thread(accept, ())


def _add_packages_dir(path):
    """`path` on sys.path just ahead of the first site-packages (like a
    user site: an upgrade there wins over the base install)."""
    if path in sys.path:
        return
    at = len(sys.path)
    for i, p in enumerate(sys.path):
        if p.endswith("site-packages") or p.endswith("dist-packages"):
            at = i
            break
    sys.path.insert(at, path)


def _flush_figures():
    """Open matplotlib figures become displays at the end of a cell."""
    global _cell_running
    _cell_running = True  # rendering is part of the cell: interruptible
    try:
        _display_module().flush_figures()
    except BaseException:
        pass
    finally:
        _cell_running = False


def _sync_linecache():
    lc = sys.modules.get("linecache")
    if lc is None or not _sources:
        return
    for name, src in _sources.items():
        lc.cache[name] = (len(src), None, src.splitlines(True), name)
    _sources.clear()


def _describe_error(etype, evalue, tb):
    import traceback

    _sync_linecache()
    # User frames only.
    tb = _user_frames(tb)
    try:
        lines = traceback.format_exception(etype, evalue, tb)
        last = traceback.format_exception_only(etype, evalue)[-1].strip()
    except Exception:
        lines = ["%s: <unprintable exception>\n" % etype.__name__]
        last = lines[0].strip()
    return last, _cap("".join(lines), MAX_VALUE)


# The reply to most cells: a success without a value, encoded once.
_OK = {"status": "ok"}
_OK_FRAME = None
# False only under `cellhost-bench dialect` (CELLHOST_BENCH_NO_DIALECT=1):
# cells skip the dialect's gate, as before the transform existed.
_dialect = True


class Runner:
    def __init__(self):
        main = type(sys)("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        self.ns = main.__dict__
        self.count = 0
        self.streams = _Streams()

    def run(self, code):
        global _cell_running
        self.count += 1
        filename = "<cell-%d>" % self.count
        _sources[filename] = code
        if _signal.getsignal(_signal.SIGINT) is not _on_sigint:
            _signal.signal(_signal.SIGINT, _on_sigint)
        if _cpu_per_cell:
            try:
                _limit_cpu()
            except Exception:
                pass
        reply = _OK
        ns = self.ns
        if _display_mod is not None:
            _display_mod.begin_cell()
        try:
            _cell_running = True
            try:
                if _dialect and _has_escapes(code):
                    code = _transform(code, filename)
                head, last, tail = _compile_cell(code, filename)
                if head is not None:
                    exec(head, ns)
                if tail is not None:
                    exec(tail, ns)
                if last is not None:
                    value = eval(last, ns)
                    if value is not None:
                        builtins._ = value
                        text = repr(value)
                        reply = {"status": "ok", "value": _cap(text, MAX_VALUE)}
                        if _maybe_rich(value):
                            _display_module().show_value(value, text)
            finally:
                _cell_running = False
        except SystemExit as e:
            code = e.code
            reply = {"status": "exit"}
            if code is None:
                code = 0
            if not isinstance(code, int):
                try:
                    print(code, file=sys.stderr)
                    reply["error"] = _cap("SystemExit: %s" % (code,), MAX_VALUE)
                except Exception:
                    pass
                code = 1
            reply["exit_code"] = code
        except BaseException as e:
            etype = type(e)
            reply = {"status": "interrupted" if etype is KeyboardInterrupt else "error"}
            try:
                reply["error"], reply["traceback"] = _describe_error(etype, e, e.__traceback__)
            except Exception:
                # Describing needs `traceback` and source files: at the
                # open-files or memory limit that can fail. Say what we can.
                try:
                    text = "%s: %s" % (etype.__name__, e)
                except Exception:
                    text = etype.__name__
                reply["error"] = _cap(text, MAX_VALUE)
            breach = _breach_of(e)
            if breach:
                reply["breach"] = breach
            if etype is not KeyboardInterrupt:
                hint = _hint_of(e)
                if hint:
                    reply["hint"] = hint
            e = None
        finally:
            _cell_running = False
        if "matplotlib.pyplot" in _modules and reply["status"] != "exit":
            _flush_figures()
        if _display_mod is not None:
            dropped, note = _display_mod.take_drops()
            if dropped:
                reply = dict(reply)
                reply["displays_dropped"] = dropped
                reply["displays_note"] = note
        return reply

    def settle(self):
        _flush_c_stdio()
        self.streams.restore()
        _sync_linecache()


def _setup_display():
    global _display_source, _pipmagic_source
    here = os.path.dirname(_runner_file)
    with open(os.path.join(here, "display.py"), "rb") as f:
        _display_source = f.read()
    try:
        with open(os.path.join(here, "pipmagic.py"), "rb") as f:
            _pipmagic_source = f.read()
    except OSError:
        pass  # a remote runner ships without it
    builtins.display = display
    _setup_helpers()  # helpers.py
    sys.meta_path.insert(0, _MatplotlibHook)
    # Ahead of the path finders: a cell's own `pipmagic.py` in the cwd
    # never stands in for the runner's.
    sys.meta_path.insert(1, _PipMagicHook)
    os.register_at_fork(after_in_child=_after_fork)


def _snapshot_op(runner, op, path, file_max=None):
    # Between cells only (the host sends it in a turn of its own): the
    # session's namespace to or from the host's FIFO (snapshot.py); with
    # `file_max` (a remote kernel), to or from a file on this host, at most
    # that many bytes.
    # Pickling runs the cells' code (__reduce__, __setstate__), so the op
    # is interruptible as a cell is: the host's timeout interrupts it.
    global _cell_running
    import json

    try:
        mod = _helper("snapshot")
        _cell_running = True
        try:
            if file_max is not None:
                if op == b"snapshot":
                    summary = mod.take_file(runner.ns, path, file_max)
                else:
                    summary = mod.load_file(runner.ns, path)
            elif op == b"snapshot":
                summary = mod.take(runner.ns, path)
            else:
                summary = mod.load(runner.ns, path)
        finally:
            _cell_running = False
        return {"status": "ok", "value": json.dumps(summary)}
    except BaseException as e:
        return {"status": "error", "error": _cap("%s: %s" % (type(e).__name__, e), MAX_VALUE)}


def _after_fork():
    global _forked
    _forked = True


# --- process fork: a new session's kernel as a copy of this one -------------
# (docs/snapshots.md, "Fork"). Between cells the host asks for a fork with
# the path of a one-shot socket in the new kernel's staging dir; the child
# takes a session and process group of its own, receives its own pipes
# (stdout, stderr, control in/out, death) over the socket and puts them on
# fds 1-5, takes its new runner dir, tool token, cwd and package dir, and
# says hello there. Memory is shared copy-on-write. A kernel whose state a
# fork could not copy alone (threads, open files) is refused with the
# reason: the host then copies the state by snapshot and restore.

_forks = []  # pids forked into new sessions, reaped between requests
_runner_fds = set()  # the fds open at the hello: the runner's own


def _open_fds():
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    fds = set()
    for n in names:
        try:
            fd = int(n)
            os.fstat(fd)  # listdir's own fd is closed by now
        except (ValueError, OSError):
            continue
        fds.add(fd)
    return fds


def _fork_refusal():
    if not hasattr(os, "fork") or not hasattr(os, "setsid") or not hasattr(os, "register_at_fork"):
        return "this Python has no fork()"
    threading = sys.modules.get("threading")
    if threading is not None:
        main = threading.main_thread()
        extra = [
            t.name
            for t in threading.enumerate()
            if t is not main and t.is_alive() and not isinstance(t, threading._DummyThread)
        ]
        if extra:
            return "the kernel runs %d thread(s) of its own (%s), which fork() does not copy" % (
                len(extra),
                ", ".join(extra[:5]),
            )
    fds = _open_fds()
    if fds is None:
        return "the kernel cannot list its open files (/proc/self/fd)"
    extra = sorted(fds - _runner_fds)
    if extra:
        return (
            "the kernel holds %d open file(s), socket(s) or pipe(s) (fd %s), which a forked "
            "process would share with its source" % (len(extra), ", ".join(str(f) for f in extra[:8]))
        )
    return None


def _reap_forks():
    for pid in list(_forks):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _forks.remove(pid)


def _fork_op(runner, req):
    # Returns the source's reply, or None in the child (its hello is out).
    import json

    why = _fork_refusal()
    if why:
        return {"status": "error", "error": why, "refused": "1"}
    path = req.get("path", b"").decode("utf-8", "surrogateescape")
    waits = req.get("wait") == b"1"  # a template's spare: handed on later
    import socket  # noqa: F401  (imported once here, not in every child)
    from array import array  # noqa: F401

    try:
        runner.settle()  # nothing buffered is written twice
    except BaseException:
        pass
    names = sum(1 for n in runner.ns if not (n.startswith("__") and n.endswith("__")) and n != "_")
    pid = os.fork()
    if pid:
        _forks.append(pid)
        return {"status": "ok", "value": json.dumps({"pid": pid, "names": names})}
    try:
        _rehome(runner, path, waits)
    except BaseException as e:
        # Told on a strict fork's status pipe (the host names it), else on
        # whatever stderr the child has by now.
        where = []
        tb = e.__traceback__
        while tb is not None:
            where.append("%s:%d" % (tb.tb_frame.f_code.co_name, tb.tb_lineno))
            tb = tb.tb_next
        where = " (at %s)" % " < ".join(reversed(where[-4:])) if where else ""
        line = ("error: re-homing: %s: %s%s\n" % (type(e).__name__, e, where)).encode("utf-8", "replace")
        try:
            os.write(_status_fd if _status_fd is not None else 2, line)
        except OSError:
            pass
        os._exit(70)
    return None


_status_fd = None  # a strict fork's status pipe (strictfork.py), until it is sealed
_TEMPLATE_NAME = "cellhost-tmpl"
_SPARE_NAME = "cellhost-spare"
_process_name = None  # the name a template had before it took its own


def _name_process(name):
    # (Bytes through os: a fork's first text-mode open costs ~0.4 ms.)
    global _process_name
    try:
        fd = os.open("/proc/self/comm", os.O_RDWR)
        try:
            before = os.read(fd, 64).strip()
            os.lseek(fd, 0, 0)
            os.write(fd, name.encode("utf-8", "replace"))
        finally:
            os.close(fd)
        if name == _TEMPLATE_NAME:
            _process_name = before.decode("utf-8", "replace")
    except OSError:
        pass


def _rehome(runner, path, waits=False):
    global _forked, _runner_file, _tools_token, _packages_dir, _runner_fds, _status_fd
    import json
    import socket

    os.setsid()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(path)
    if waits:
        # Until the host hands it on, or closes the socket (it is gone);
        # meanwhile it holds none of its template's pipes. First the host
        # says it is in its own cgroup (what it touches from then on is
        # charged there, not to its template's): "g", then (a strict
        # template's fork) the length of a JSON config, the config and its
        # status pipe.
        s.settimeout(None)
        msg, ancdata, _, _ = s.recvmsg(5 if _strict_template else 1, socket.CMSG_SPACE(8))
        if msg[:1] != b"g":
            raise OSError("the host went away")
        if _strict_template:
            status = _received_fds(ancdata)
            _status_fd = status[0] if status else None
            size = int.from_bytes(msg[1:5], "big") if len(msg) == 5 else -1
            cfg = _recv_exactly(s, size)
            if len(status) not in (1, 2) or cfg is None:
                raise OSError("the host sent no sandbox config")
            # Returns in the kernel to be only (docs/templates.md); the
            # second fd is its Landlock ruleset.
            landlock = status[1] if len(status) == 2 else None
            _helper("strictfork").split(json.loads(cfg.decode("utf-8")), status[0], landlock)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in [1, 2, CTRL_IN, CTRL_OUT] + [copy for _, copy in runner.streams.saved]:
            os.dup2(null, fd, inheritable=fd < 3)
        os.close(null)
        _name_process(_SPARE_NAME)  # not a template, not a kernel yet
        if _warmup and _preload:
            # Again, in this process: the pages a first frame, repr or
            # figure touches are copied now, not in the session's cell.
            _warm_up()
        _rehearse()
    msg, ancdata, _, _ = s.recvmsg(1 << 16, socket.CMSG_SPACE(16 * 4))
    chunks = [msg]
    while True:
        more = s.recv(1 << 16)
        if not more:
            break
        chunks.append(more)
    s.close()
    fds = _received_fds(ancdata)
    new = json.loads(b"".join(chunks).decode("utf-8"))
    if _strict_template and new.get("strict") is None:
        raise OSError("a strict template's fork was handed no sandbox")  # it runs as root
    extra = 0 if new.get("strict") is None else new["strict"]["fds"]
    if len(fds) != 5 + extra:
        raise OSError("expected %d fds, got %d" % (5 + extra, len(fds)))
    if extra:
        # Its mounts, uid, capabilities, Landlock and seccomp: a sandboxed
        # kernel from here on (strictfork.py). Closes fds[5:].
        _helper("strictfork").seal(new["strict"], fds[5:])
        del fds[5:]
        os.close(_status_fd)  # its init tells the rest
        _status_fd = None
    out, err, ctrl_in, ctrl_out, death = fds
    # The copies streams.py puts back on fds 1/2 after each cell first.
    for fd, copy in runner.streams.saved:
        os.dup2(out if fd == 1 else err, copy, inheritable=False)
    for src, dst in ((out, 1), (err, 2), (ctrl_in, CTRL_IN), (ctrl_out, CTRL_OUT), (death, DEATH)):
        os.dup2(src, dst, inheritable=dst < 3)
    for fd in fds:
        os.close(fd)
    _forked = False
    if _process_name is not None:
        _name_process(_process_name)  # forked from a template: a kernel again
    _runner_file = new["runner"]
    _tools_token = new["token"]
    sock = os.path.join(os.path.dirname(_runner_file), "tools.sock")
    # The modules made, not a scan of every module: after a fork each
    # object touched is a page copied.
    for mod in list(_tools_modules):
        mod._SOCKET = sock
        mod._TOKEN = _tools_token
    _shell_groups.clear()
    del _forks[:]
    if new.get("cwd"):
        os.chdir(new["cwd"])
    pkgs = new.get("packages")
    if pkgs and _packages_dir:
        sys.path[:] = [pkgs if p == _packages_dir else p for p in sys.path]
        _packages_dir = pkgs
    if _egress_socket:
        _start_egress_forwarder(_egress_socket)  # deferred by a template
    _hello(None)
    # After the hello, before the next request is read (so no cell runs
    # first): off the hand-over's path.
    _thread.start_new_thread(_watch_death, ())
    _runner_fds = _open_fds() or set()


def _rehearse():
    # A spare, before it waits: the hand-over's paths run once on dummies,
    # so the pages they touch (data copied on write, and code the fork has
    # not mapped yet) fault in now, not on a new session's first reply:
    # ~100 pages, ~5 us each on a VM like this project's.
    import json
    import socket
    from array import array

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        payload = {"runner": "/x/runner.py", "token": "t", "cwd": None, "packages": None}
        if _strict_template:
            payload["strict"] = {"uid": 1, "gid": 1, "fds": 1, "mounts": [["/x", 0]]}
        a.sendmsg(
            [json.dumps(payload).encode("utf-8")],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", [null]).tobytes())],
        )
        msg, ancdata, _, _ = b.recvmsg(1 << 16, socket.CMSG_SPACE(16 * 4))
        for fd in _received_fds(ancdata):
            os.close(fd)
        new = json.loads(msg.decode("utf-8"))
        os.path.join(os.path.dirname(new["runner"]), "tools.sock")
        list(_tools_modules)
        new.get("cwd")
    finally:
        os.close(null)
        a.close()
        b.close()
    _open_fds()
    if _strict_template:
        _helper("strictfork").rehearse()


def _received_fds(ancdata):
    from array import array

    fds = array("i")
    for level, kind, blob in ancdata:
        if level == 1 and kind == 1:  # SOL_SOCKET, SCM_RIGHTS
            fds.frombytes(blob[: len(blob) - len(blob) % fds.itemsize])
    return list(fds)


def _recv_exactly(s, size):
    if size < 0 or size > 1 << 20:
        return None
    buf = b""
    while len(buf) < size:
        more = s.recv(size - len(buf))
        if not more:
            return None
        buf += more
    return buf


def _hello(skipped):
    v = sys.version_info
    _write_frame(
        {
            "op": "hello",
            "preload_skipped": skipped,
            "pid": os.getpid(),
            "version": "%d.%d.%d" % (v[0], v[1], v[2]),
            "executable": sys.executable,
        }
    )


def _parse_args():
    global _cpu_per_cell, _process_time, MAX_DISPLAY, MAX_CELL_BYTES, MAX_CELL_DISPLAYS, _network
    global _packages_dir, _warmup, _egress_socket, _strict_template
    for arg in sys.argv[1:]:
        if arg.startswith("--cpu-per-cell="):
            _cpu_per_cell = int(arg.split("=", 1)[1])
            from time import process_time as _process_time
        elif arg.startswith("--egress="):
            _egress_socket = arg.split("=", 1)[1]
        elif arg == "--template=strict":
            _strict_template = True
        elif arg.startswith("--preload="):
            _preload.extend(m for m in arg.split("=", 1)[1].split(",") if m)
        elif arg == "--warmup":
            _warmup = True
        elif arg.startswith("--packages="):
            _packages_dir = arg.split("=", 1)[1]
        elif arg.startswith("--chdir="):
            os.chdir(arg.split("=", 1)[1])
        elif arg.startswith("--network="):
            _network = arg.split("=", 1)[1]
        elif arg.startswith("--display="):
            caps = arg.split("=", 1)[1].split(",")
            MAX_DISPLAY, MAX_CELL_BYTES, MAX_CELL_DISPLAYS = (int(c) for c in caps)
    del sys.argv[1:]
    if _egress_socket and not _strict_template:
        _start_egress_forwarder(_egress_socket)
        _egress_socket = None
    # (A strict template's forwarder is each fork's own, started once the
    # fork is sealed: a template with a thread could not fork.)


def main():
    global _tools_token, _dialect, _runner_fds
    _parse_args()
    _tools_token = os.environ.pop("CELLHOST_TOOLS_TOKEN", None)
    if os.environ.pop("CELLHOST_TEMPLATE", None) == "1":
        _name_process(_TEMPLATE_NAME)  # a warm template: its forks are kernels
    _dialect = os.environ.pop("CELLHOST_BENCH_NO_DIALECT", None) != "1"
    if _cpu_per_cell:
        # Import `resource` (a shared library) and set the limit now, at
        # start, rather than in the first cell: a new session's first cell
        # (often a pooled kernel's) should cost what a warm one does.
        _limit_cpu()
    for fd in (CTRL_IN, CTRL_OUT, DEATH):
        os.set_inheritable(fd, False)
    _setup_display()
    if _strict_template:
        # Compiled once, before any fork; the template's privileges down to
        # what its forks need, before the preload imports run.
        _helper("strictfork").harden()
    _thread.start_new_thread(_watch_death, ())
    _signal.signal(_signal.SIGINT, _on_sigint)
    try:
        import faulthandler  # builtin: a segfault prints a Python traceback

        faulthandler.enable()
    except Exception:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            # Line-buffered: one write per line keeps print() in order with
            # os.write and child processes at a fraction of -u's syscalls.
            stream.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
        except Exception:
            pass
    # Interactive-style import path: the cwd, not the staging dir.
    if sys.path and os.path.dirname(os.path.abspath(_runner_file)) == os.path.abspath(sys.path[0] or "."):
        sys.path[0] = ""
    if _packages_dir:
        _add_packages_dir(_packages_dir)
    global _OK_FRAME
    _OK_FRAME = _encode({"status": "ok", "op": "done"})
    global _SYNC_FRAME, _ordered
    _SYNC_FRAME = _encode({"op": "sync"})
    runner = Runner()
    skipped = []
    for name in _preload:
        try:
            __import__(name)
        except BaseException as e:  # a broken module must not fail the pool
            skipped.append("%s (%s: %s)" % (name, type(e).__name__, e))
    if _warmup and _preload:
        skipped.extend(_warm_up())
    _runner_fds = _open_fds() or set()
    _hello("; ".join(skipped) or None)
    while True:
        try:
            req = _read_frame()
            if req is None:
                os._exit(0)
            if _forks:
                _reap_forks()
            op = req.get("op")
            if op == b"exec":
                code = req.get("code", b"").decode("utf-8", "surrogateescape")
                tools_ok = "tools" not in req or _install_tools(req)
                _ordered = "order" in req
                try:
                    reply = runner.run(code)
                finally:
                    _ordered = False
                if not tools_ok:
                    reply = dict(reply)
                    reply["tools_failed"] = 1
            elif op in (b"snapshot", b"restore"):
                reply = _snapshot_op(runner, op, req.get("path", b"").decode("utf-8", "surrogateescape"))
            elif op == b"fork":
                reply = _fork_op(runner, req)
                if reply is None:
                    continue  # the forked child: its hello went out on its own pipes
            else:
                reply = {"status": "error", "error": "cellhost runner: unknown request %r" % (op,)}
            try:
                runner.settle()
            except BaseException:
                pass
            if reply is _OK:
                _send(_OK_FRAME)
            else:
                reply["op"] = "done"
                _write_frame(reply)
            if reply["status"] == "exit":
                break
        except KeyboardInterrupt:
            # A late SIGINT that slipped past the guard: the cell is over,
            # nothing to interrupt.
            continue
    for fd in (CTRL_IN, CTRL_OUT):
        try:
            os.close(fd)
        except OSError:
            pass
    sys.exit(reply.get("exit_code", 0))


if __name__ == "__main__":
    main()
