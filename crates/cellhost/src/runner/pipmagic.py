"""`%pip` in cellhost kernels: the host installs, this module asks.

`%pip install NAME`, `!pip install NAME` and `!python -m pip install NAME`
become `pip_magic("install NAME")`. The kernel never runs pip itself (a
strict sandbox has no network and a read-only site-packages): the line goes
to the host over the kernel's tool socket, the host runs pip in a sandbox
of its own into this session's package dir (kept for the session's
lifetime), and pip's output streams into this cell. The package dir is on
sys.path, and import caches are refreshed, so `import NAME` works on the
next line.
"""
# The runner sets _SOCKET, _TOKEN (the tool socket and its token) and _PATH
# (the package dir as this kernel sees it, or None) before running this.
# Wire: the tool socket's frames (4-byte little-endian length, JSON); the
# host answers the reserved request "cellhost:pip" with {"output": text}
# frames, then one {"result": {...}} or {"error": "..."}.

import os as _os
import sys as _sys

_REQUEST = "cellhost:pip"


class PipError(Exception):
    """`%pip` failed or was refused; the message says why (pip's own last
    lines for a failed install, or the [packages] rule that refused)."""


def _recv_exact(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise PipError("the host closed the connection during %pip (is the kernel stopping?)")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _refresh(path):
    import importlib

    if path and path not in _sys.path:
        at = len(_sys.path)
        for i, p in enumerate(_sys.path):
            if p.endswith("site-packages") or p.endswith("dist-packages"):
                at = i
                break
        _sys.path.insert(at, path)
    _sys.path_importer_cache.pop(path, None)
    importlib.invalidate_caches()


_REMOTE = globals().get("_REMOTE")


def _remote_pip(line):
    # A remote kernel: pip runs here, on the remote side (see remotepip.py).
    here = _REMOTE["here"]
    mod = {"__name__": "cellhost_remotepip"}
    with open(_os.path.join(here, "remotepip.py"), "rb") as f:
        exec(compile(f.read(), "<cellhost remotepip>", "exec"), mod)
    with open(_os.path.join(here, "pipuninstall.py"), "rb") as f:
        uninstaller = f.read().decode()
    status = mod["run"](str(line), _REMOTE["policy"], _REMOTE["dir"], uninstaller, PipError)
    _refresh(_REMOTE["dir"])
    return status


def pip_magic(line: str) -> int:
    """Run `%pip <line>` (install, list, show) through the host. Returns
    pip's exit status (0); raises PipError when pip failed or the line was
    refused."""
    import json
    import socket

    if _REMOTE is not None:
        return _remote_pip(line)
    if not _TOKEN or not _os.path.exists(_SOCKET):
        raise PipError("%pip is unavailable in this kernel: it has no channel to the host")
    body = json.dumps({"token": _TOKEN, "tool": _REQUEST, "args": {"line": str(line)}}).encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            s.connect(_SOCKET)
        except OSError as e:
            raise PipError("%%pip cannot reach the host at %s: %s" % (_SOCKET, e)) from None
        s.sendall(len(body).to_bytes(4, "little") + body)
        out = _sys.stdout
        while True:
            n = int.from_bytes(_recv_exact(s, 4), "little")
            msg = json.loads(_recv_exact(s, n))
            if "output" in msg:
                out.write(msg["output"])
                out.flush()
                continue
            if "error" in msg:
                raise PipError(msg["error"])
            result = msg.get("result") or {}
            _refresh(result.get("path") or _PATH)
            return int(result.get("status", 0))
    finally:
        s.close()
