# cellhost kernel runner, part 5 of 7 (compile.py, limits.py, helpers.py and
# warmup.py come first, streams.py and runner.py last, in one shipped
# script): the frames on the control pipes. Requests arrive on fd 3
# (CTRL_IN), replies and display frames leave on fd 4 (CTRL_OUT); runner.py
# defines both and the fd table.
#
# Frame: 4-byte little-endian body length, then fields, each written as
# b"<name> <len>\n" followed by <len> raw bytes. No escaping, binary safe.
#
# Display frames (op=display) may be written at any time, from any thread,
# so every write to fd 4 holds `_out_lock`. Builtin imports only.

import os
import _thread


def _encode(fields):
    parts = []
    for name, value in fields.items():
        if value is None:
            continue
        if isinstance(value, str):
            value = value.encode("utf-8", "surrogateescape")
        elif not isinstance(value, bytes):
            value = str(value).encode()
        parts.append(b"%s %d\n" % (name.encode(), len(value)))
        parts.append(value)
    body = b"".join(parts)
    return len(body).to_bytes(4, "little") + body


def _decode(body):
    out = {}
    i = 0
    n = len(body)
    while i < n:
        j = body.index(b"\n", i)
        name, size = body[i:j].split(b" ")
        start = j + 1
        end = start + int(size)
        out[name.decode()] = body[start:end]
        i = end
    return out


_pending = bytearray()


def _read_frame():
    # One read() usually holds exactly one whole request (the host sends one
    # at a time); big cells arrive in pieces and are assembled.
    if not _pending:
        data = os.read(CTRL_IN, 65536)
        if not data:
            return None
        if len(data) >= 4 and len(data) == 4 + int.from_bytes(data[:4], "little"):
            return _decode(data[4:])
        _pending.extend(data)
    buf = _pending
    while len(buf) < 4:
        chunk = os.read(CTRL_IN, 65536)
        if not chunk:
            return None
        buf += chunk
    need = 4 + int.from_bytes(buf[:4], "little")
    while len(buf) < need:
        chunk = os.read(CTRL_IN, max(65536, need - len(buf)))
        if not chunk:
            return None
        buf += chunk
    body = bytes(buf[4:need])
    del buf[:need]
    return _decode(body)


def _write_frame(fields):
    _send(_encode(fields))


_out_lock = _thread.allocate_lock()
_main_thread = _thread.get_ident()
_forked = False  # set in a fork()ed child (multiprocessing): it must stay off fd 4
_main_writing = False
_sigint_deferred = False


def _send(frame):
    """Write one whole frame to the reply pipe; safe from any thread.

    Frames never interleave (one lock), a forked child never writes into its
    parent's pipe, and a SIGINT that lands while the main thread is half way
    through a frame is raised only once the frame is complete.
    """
    global _main_writing, _sigint_deferred
    if _forked:
        return False
    main = _thread.get_ident() == _main_thread
    with _out_lock:
        if main:
            _main_writing = True
        try:
            _write_bytes(frame)
        finally:
            if main:
                _main_writing = False
    if main and _sigint_deferred:
        _sigint_deferred = False
        if _cell_running:
            raise KeyboardInterrupt
    return True


_ordered = False  # the running cell is watched: its displays wait for its output
_SYNC_FRAME = b""


def _order():
    """Before a display of a watched cell: what the cell printed so far
    reaches the watcher first. stdout/stderr travel on other pipes than
    display frames, so the host could read a display before an earlier
    print(); here the runner flushes, writes a `sync` frame and waits for
    the host's ack on fd 3, which the host sends once it has read
    everything already in the stdout and stderr pipes. Main thread only:
    fd 3 is read by the main thread alone (a thread's display is not
    ordered). Unwatched cells never get here."""
    global _main_writing, _sigint_deferred
    if not _ordered or _forked or _thread.get_ident() != _main_thread:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    with _out_lock:
        # A SIGINT now is raised once the display is out (see _send):
        # an ack left unread would be taken for the next request.
        _main_writing = True
        try:
            _write_bytes(_SYNC_FRAME)
            ack = _read_frame()
        finally:
            _main_writing = False
    if ack is None:
        os._exit(0)


def _write_bytes(data):
    data = memoryview(data)
    while data:
        try:
            n = os.write(CTRL_OUT, data)
        except InterruptedError:
            continue
        data = data[n:]
