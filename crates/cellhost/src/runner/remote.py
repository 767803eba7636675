# cellhost remote runner: drives runner.py's cell execution through files
# in its kernel dir, for hosts reached only by run-to-completion exec (ssh,
# docker exec, kubectl exec). Stdlib only, Python >= 3.8.
#
# Shipped next to runner.py and display.py into a 0700 kernel dir. Modes:
#   remote.py serve DIR IDLE MAX_STREAM [CHDIR]   the detached runner
#   remote.py oneshot DIR MAX_STREAM [CHDIR]      one cell: code on stdin,
#                                                 result blob on stdout
#
# The host writes each request (a runner.py frame: code, and the tools
# module source when the cell has tools) atomically as DIR/req.N and
# wakes the runner with SIGUSR1; the runner claims it (rename to run.N),
# runs it with fds 1/2 on DIR/out.N and DIR/err.N and the control fd 4 on
# DIR/frames.N (runner.py's display and reply frames), then writes the
# result blob to DIR/tmp.res.N and renames it to DIR/res.N:
#
#   b"CELLHOST1 <frames> <stdout> <stderr> <stdout total> <stderr total>\n"
#   + frames + stdout + stderr
#
# Each stream keeps at most MAX_STREAM bytes (head and tail, with a marker
# between); the totals are the bytes the cell wrote, so the host counts
# what was cut here too; the frames keep whole frames only (display frames that do not
# fit are dropped and counted in the reply). With no request for IDLE seconds the runner removes its dir and
# exits by itself. The RPC token arrives in DIR/env (written from stdin at
# ship time) and is read once, then the file is removed.

import os
import sys
import signal

DIR = sys.argv[2]
MAX_STREAM = 8 << 20

sys.dont_write_bytecode = True  # the kernel dir holds only what was shipped
sys.path.insert(0, DIR)
import runner as R  # noqa: E402  (the shipped runner.py)

del sys.path[0]
_token = None


def _read_env():
    global _token
    path = os.path.join(DIR, "env")
    try:
        with open(path, "rb") as f:
            for line in f.read().decode().splitlines():
                name, _, value = line.partition("=")
                if name == "CELLHOST_RPC_TOKEN":
                    # For the tools stub (Tool RPC): kept in memory only,
                    # never in the environment cells and children inherit.
                    _token = value
                    R._rpc_token = value
                    R._tools_token = value
                elif name == "CELLHOST_DISPLAY":
                    # The kernel's display caps, as --display= gives a
                    # local runner; a cell's displays must also fit in the
                    # MAX_STREAM bytes of frames the result carries.
                    most = max(MAX_STREAM - (1 << 20), 1 << 16)
                    caps = [int(c) for c in value.split(",")]
                    R.MAX_CELL_BYTES = min(caps[1], most)
                    R.MAX_DISPLAY = min(caps[0], R.MAX_CELL_BYTES)
                    R.MAX_CELL_DISPLAYS = caps[2]
        os.unlink(path)
    except OSError:
        pass


def _open(path):
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)


def _capped(path):
    """The stream's bytes (head and tail when over MAX_STREAM) and how
    many the cell wrote."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size <= MAX_STREAM:
                data = f.read()
                return data, len(data)
            half = MAX_STREAM // 2
            head = f.read(half)
            f.seek(size - half)
            tail = f.read()
    except OSError:
        return b"", 0
    cut = size - 2 * half
    return head + (b"\n[... %d bytes cut on the remote host ...]\n" % cut) + tail, size


def _frames(path, reply):
    """The cell's display frames and then its reply frame, within
    MAX_STREAM: a display frame that does not fit whole is dropped (and
    counted in the reply), never cut, so the host always reads whole
    frames."""
    budget = MAX_STREAM - len(R._encode(reply)) - 4096
    kept, size, dropped = [], 0, 0
    try:
        with open(path, "rb") as f:
            while True:
                head = f.read(4)
                if len(head) < 4:
                    break
                n = int.from_bytes(head, "little")
                if size + 4 + n > budget:
                    f.seek(n, 1)
                    dropped += 1
                    continue
                body = f.read(n)
                if len(body) < n:
                    break
                kept.append(head + body)
                size += 4 + n
    except OSError:
        pass
    if dropped:
        reply["displays_dropped"] = int(reply.get("displays_dropped") or 0) + dropped
        reply["displays_note"] = (
            "%d display output(s) did not fit in the %d-byte result of a remote cell and were dropped"
            % (dropped, MAX_STREAM)
        )
    kept.append(R._encode(reply))
    return b"".join(kept)


def _run_cell(runner, work, n):
    """Run one request (`work(runner)`: a cell, or a snapshot op) with its
    output captured at fd level; returns the blob."""
    out_p, err_p, frames_p = ("%s/%s.%s" % (DIR, k, n) for k in ("out", "err", "frames"))
    out_fd, err_fd, frames_fd = _open(out_p), _open(err_p), _open(frames_p)
    os.dup2(frames_fd, R.CTRL_OUT)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    # runner.py puts these back on fds 1/2 after the cell (a cell may close
    # or redirect them).
    runner.streams.saved = [(1, out_fd), (2, err_fd)]
    global _cell_n
    _cell_n = int(n)
    try:
        reply = work(runner)
    finally:
        _cell_n = None
    try:
        runner.settle()
    except BaseException:
        pass
    reply = dict(reply)
    reply["op"] = "done"
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (R.CTRL_OUT, 1, 2):
        os.dup2(null, fd)
    for fd in (null, out_fd, err_fd, frames_fd):
        os.close(fd)
    (out, out_total), (err, err_total) = _capped(out_p), _capped(err_p)
    parts = [_frames(frames_p, reply), out, err]
    for p in (frames_p, out_p, err_p):
        try:
            os.unlink(p)
        except OSError:
            pass
    head = b"CELLHOST1 %d %d %d %d %d\n" % (tuple(len(p) for p in parts) + (out_total, err_total))
    return head + b"".join(parts), reply


def _write_atomic(name, data):
    tmp = os.path.join(DIR, "tmp." + name)
    fd = _open(tmp)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(DIR, name))


def _setup_packages(cwd):
    # The session's workspace (`<home>/ws`, the cwd the host made): its
    # package dir is `<home>/pkgs`, on sys.path ahead of site-packages,
    # and `%pip` runs pip here under the policy the host wrote beside it.
    import json

    cwd = os.path.abspath(cwd)
    if os.path.basename(cwd) != "ws":
        return
    home = os.path.dirname(cwd)
    try:
        with open(os.path.join(home, "packages.json"), "rb") as f:
            policy = json.loads(f.read())
    except (OSError, ValueError):
        return
    pkgs = os.path.join(home, "pkgs")
    R._packages_dir = pkgs
    R._pip_remote = {"policy": policy, "dir": pkgs, "here": DIR}
    R._add_packages_dir(pkgs)


def _setup(chdir):
    _read_env()
    R._setup_display()
    signal.signal(signal.SIGINT, R._on_sigint)
    try:
        import faulthandler

        faulthandler.enable(file=sys.__stderr__)
    except Exception:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            # As runner.py does: one write per line keeps print() in order
            # with os.write and child processes.
            stream.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
        except Exception:
            pass
    if chdir:
        os.chdir(chdir)
        _setup_packages(chdir)
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.abspath(DIR):
        sys.path[0] = ""
    return R.Runner()


_tool_seq = iter(range(1, 1 << 62))
# The request number of the cell running now (None between cells): each
# tool request says which cell it was made in, and the host serves it
# only under that cell's authority (a request written between cells by a
# thread a finished cell left running is refused, never served by the
# next cell).
_cell_n = None


def _file_invoke(name, args):
    # The tools module's transport on a remote kernel: the request goes
    # into DIR/toolreq.K (atomically); the host's waiting exec sees it,
    # serves it under the running cell's authority and writes
    # DIR/toolres.K. Waiting here costs no round trips.
    import json
    import time

    tools = sys.modules["tools"]
    try:
        body = json.dumps(
            {"token": _token, "tool": name, "args": args, "cell": _cell_n}, allow_nan=False
        ).encode()
    except (TypeError, ValueError) as e:
        raise tools.ToolError("the arguments of %s are not JSON-serializable: %s" % (name, e)) from None
    if len(body) > tools.MAX_PAYLOAD:
        raise tools.ToolError(
            "the request to %s is %d bytes, over the %d-byte limit; pass less data per call"
            % (name, len(body), tools.MAX_PAYLOAD)
        )
    k = next(_tool_seq)
    _write_atomic("toolreq.%d" % k, body)
    res = os.path.join(DIR, "toolres.%d" % k)
    delay = 0.0005
    while not os.path.exists(res):
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    with open(res, "rb") as f:
        out = json.loads(f.read())
    os.unlink(res)
    if "error" in out:
        raise tools.ToolError(out["error"])
    return out.get("result")


def _read_request(path):
    """What a request asks for: a function running it, returning its reply."""
    with open(path, "rb") as f:
        req = R._decode(f.read()[4:])
    op = req.get("op", b"exec")
    if op in (b"snapshot", b"restore"):
        return lambda runner: _snapshot(runner, op, req)
    if "tools" in req and R._install_tools(req):
        sys.modules["tools"]._invoke = _file_invoke
    code = req.get("code", b"").decode("utf-8", "surrogateescape")
    return lambda runner: runner.run(code)


def _snapshot(runner, op, req):
    # A snapshot stays on this host, beside the kernel dirs (which go when
    # a runner exits), under a name the host picks: no path from it.
    name = req.get("path", b"").decode("utf-8", "surrogateescape")
    if not name or "/" in name or name.startswith("."):
        return {"status": "error", "error": "ValueError: bad snapshot name %r" % (name,)}
    path = os.path.join(os.path.dirname(DIR), "cellhost-snapshots", name)
    most = int(req.get("max", b"0") or 0)
    return R._snapshot_op(runner, op, path, file_max=most)


def _pending():
    names = [x for x in os.listdir(DIR) if x.startswith("req.")]
    return sorted(names, key=lambda x: int(x[4:]) if x[4:].isdigit() else 0)


def _remove_dir():
    import shutil

    shutil.rmtree(DIR, ignore_errors=True)


def serve(idle):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    runner = _setup(sys.argv[5] if len(sys.argv) > 5 else "")
    _write_atomic("ready", b"%d\n" % os.getpid())
    while True:
        names = _pending()
        if not names:
            if signal.sigtimedwait([signal.SIGUSR1], idle) is None and not _pending():
                _remove_dir()
                os._exit(0)
            continue
        for name in names:
            n = name[4:]
            run = os.path.join(DIR, "run." + n)
            try:
                os.rename(os.path.join(DIR, name), run)  # claim it: never run twice
                work = _read_request(run)
            except OSError:
                continue
            try:
                blob, reply = _run_cell(runner, work, n)
            except KeyboardInterrupt:
                continue
            _write_atomic("res." + n, blob)
            try:
                os.unlink(run)
            except OSError:
                pass
            if reply.get("status") == "exit":
                os._exit(int(reply.get("exit_code", 0) or 0))


def oneshot():
    blob_fd = os.dup(1)
    runner = _setup(sys.argv[4] if len(sys.argv) > 4 else "")
    code = sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
    blob, _ = _run_cell(runner, lambda r: r.run(code), "1")
    view = memoryview(blob)
    while view:
        view = view[os.write(blob_fd, view):]
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        MAX_STREAM = int(sys.argv[4])
        serve(float(sys.argv[3]))
    else:
        MAX_STREAM = int(sys.argv[3])
        oneshot()
