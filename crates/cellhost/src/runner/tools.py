"""The agent's tools, callable from this kernel's cells.

Each tool is a function taking keyword arguments (see help(tools.NAME));
tools.call(name, **kwargs) calls one by name. Results come back as Python
objects (JSON types). A failed call raises tools.ToolError with the reason:
the tool's own error, or a refusal (budget spent, tool not allowed in this
cell, no cell running).
"""
# cellhost tool client, part 1 of 2 (the generated functions follow). Stdlib
# only. The runner sets _SOCKET, _TOKEN, _MAX (the payload limit) and
# _UNAVAILABLE (why there is no tool socket, or None) in this module's
# namespace before running it. Wire: a 4-byte little-endian length, then JSON, both ways; one
# call at a time per connection, one connection per thread.

import _thread as _cellhost_thread
import os as _cellhost_os

MAX_PAYLOAD = _MAX


class ToolError(Exception):
    """A tool call failed; the message says why."""


class _Unset:
    __slots__ = ()

    def __repr__(self):
        return "<unset>"


_UNSET = _Unset()
_local = _cellhost_thread._local()


def _forget_connections():
    # A fork()ed child must not share its parent's connections.
    global _local
    _local = _cellhost_thread._local()


_cellhost_os.register_at_fork(after_in_child=_forget_connections)


class _Namespace:
    """Tools whose names share a dotted prefix (tools.fs.read)."""

    def __init__(self, name):
        self.__name__ = name

    def __repr__(self):
        names = sorted(n for n in vars(self) if not n.startswith("_"))
        return "<tools %s: %s>" % (self.__name__, ", ".join(names))


def _connect():
    import socket

    if _UNAVAILABLE:
        raise ToolError("tools are unavailable in this kernel: %s" % _UNAVAILABLE)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(_SOCKET)
    except OSError as e:
        s.close()
        raise ToolError("cannot reach the tool host at %s: %s" % (_SOCKET, e)) from None
    return s


def _recv_exact(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _exchange(sock, frame):
    sock.sendall(frame)
    head = _recv_exact(sock, 4)
    if len(head) < 4:
        return None
    n = int.from_bytes(head, "little")
    body = _recv_exact(sock, n)
    if len(body) < n:
        raise ToolError("the tool host closed the connection mid-reply")
    return body


def _invoke(name, args):
    import json

    try:
        body = json.dumps(
            {"token": _TOKEN, "tool": name, "args": args}, allow_nan=False
        ).encode()
    except (TypeError, ValueError) as e:
        raise ToolError("the arguments of %s are not JSON-serializable: %s" % (name, e)) from None
    if len(body) > MAX_PAYLOAD:
        raise ToolError(
            "the request to %s is %d bytes, over the %d-byte limit; pass less data per call"
            % (name, len(body), MAX_PAYLOAD)
        )
    frame = len(body).to_bytes(4, "little") + body
    sock = getattr(_local, "sock", None)
    _local.sock = None  # kept only after a whole exchange
    try:
        reply = None
        if sock is not None:
            try:
                reply = _exchange(sock, frame)
            except (BrokenPipeError, ConnectionResetError):
                reply = None
            if reply is None:
                # The host closed this idle connection before reading the
                # request: reconnect, transparently, once.
                sock.close()
                sock = None
        if sock is None:
            sock = _connect()
            reply = _exchange(sock, frame)
            if reply is None:
                raise ToolError("the tool host closed the connection (is the kernel stopping?)")
    except BaseException:
        if sock is not None:
            sock.close()
        raise
    _local.sock = sock
    out = json.loads(reply)
    if "error" in out:
        raise ToolError(out["error"])
    return out.get("result")


def _pack(_kw, **given):
    args = {k: v for k, v in given.items() if v is not _UNSET}
    args.update(_kw)
    return args


def call(name, /, **kwargs):
    """Call the tool `name` with keyword arguments; returns its result."""
    return _invoke(name, kwargs)
