# cellhost kernel runner, part 6 of 7 (compile.py, limits.py, helpers.py,
# warmup.py and frames.py come first, runner.py last, in one shipped
# script): the cell's output streams. Every byte a cell writes to fds 1/2
# goes straight to the host's pipes; between cells the runner puts those
# pipes (and sys.stdout/sys.stderr) back however a cell left them, and
# flushes what C code left in libc's buffer. `io`, `os` and `sys` are
# runner.py's imports.


class _Streams:
    """Keeps fds 1/2 and sys.stdout/sys.stderr usable across cells."""

    def __init__(self):
        self.saved = [(fd, os.dup(fd)) for fd in (1, 2)]
        self.stdout = sys.stdout
        self.stderr = sys.stderr

    def restore(self):
        # Put the host's pipes back on fds 1 and 2 unconditionally: one
        # dup2() is cheaper than checking with fstat() whether a cell
        # closed or redirected them.
        for fd, copy in self.saved:
            try:
                os.dup2(copy, fd)
            except OSError:
                pass
        out, err = sys.stdout, sys.stderr
        if out is self.stdout and err is self.stderr and not (out.closed or err.closed):
            out.flush()
            err.flush()
            return
        for name in ("stdout", "stderr"):
            cur = getattr(sys, name)
            orig = getattr(self, name)
            if cur is not orig:
                try:
                    cur.flush()
                except Exception:
                    pass
            if orig.closed:
                fd = 1 if name == "stdout" else 2
                orig = io.TextIOWrapper(
                    io.FileIO(fd, "w", closefd=False),
                    encoding="utf-8",
                    errors="backslashreplace",
                    line_buffering=True,
                )
                setattr(self, name, orig)
            if cur is not orig:
                setattr(sys, name, orig)
                setattr(sys, "__%s__" % name, orig)
            else:
                try:
                    orig.flush()
                except Exception:
                    pass


def _flush_c_stdio():
    # C code (printf via ctypes or an extension) writes into libc's stdio
    # buffer, which is block-buffered on a pipe. Flush it at the end of each
    # cell, but only once ctypes is loaded anyway: importing it costs ~4 ms.
    ctypes = sys.modules.get("ctypes")
    if ctypes is None:
        return
    try:
        libc = _flush_c_stdio.libc
    except AttributeError:
        try:
            libc = ctypes.CDLL(None)
        except Exception:
            libc = None
        _flush_c_stdio.libc = libc
    if libc is not None:
        try:
            libc.fflush(None)
        except Exception:
            pass
