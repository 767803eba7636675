# cellhost kernel runner: snapshots of the session's namespace (the `snapshot`
# and `restore` ops; see docs/snapshots.md). Loaded on first use by
# helpers.py's _helper, like the dialect's modules. Builtin imports only,
# plus cloudpickle when the kernel's interpreter has it.
#
# A snapshot is a stream written to (or read from) a path the host gives:
# a FIFO in the kernel's staging dir, whose other end the host compresses
# into the snapshot file (or feeds from it). Its records, each a pickle:
#
#   MAGIC, then {"python": [major, minor], "pickler": "cloudpickle"|"pickle"}
#   ("v", name, sizes)    a global, its value pickled on its own (protocol 5):
#                         followed by the pickle (sizes[0] bytes) and its
#                         out-of-band buffers (numpy arrays' memory, written
#                         as is: no copy), sizes[1:] bytes each
#   ("m", name, module)   a global bound to an imported module: re-imported
#   ("end", n)            n records before it
#
# One global at a time, so one that cannot be pickled (a socket, an open
# file, a generator, a thread, an object whose pickling raises) is listed
# with its type and the reason, never dropped silently, and never spoils
# the others.

import os
import pickle
import sys
import types

MAGIC = b"CELLHOST-SNAPSHOT 1\n"
_MAX_WHY = 200
_MAX_SKIPPED = 200

try:
    import cloudpickle as _cloudpickle
except Exception:  # not installed, or broken: stdlib pickle alone
    _cloudpickle = None


def _user_names(ns):
    """The session's own globals: not dunders, not what the runner put."""
    for name, value in list(ns.items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        if name in ("_", "__builtins__"):
            continue
        yield name, value


def _why(e):
    text = "%s: %s" % (type(e).__name__, e)
    return text if len(text) <= _MAX_WHY else text[: _MAX_WHY - 1] + "\u2026"


def _type_name(value):
    t = type(value)
    mod = getattr(t, "__module__", "builtins")
    return t.__qualname__ if mod in ("builtins", "__main__") else "%s.%s" % (mod, t.__qualname__)


def _defined_in_cell(value):
    return isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == "__main__"


def _dumps(value):
    """The value's pickle and its out-of-band buffers (memoryviews of the
    objects' own memory, not copies)."""
    bufs = []
    if _cloudpickle is not None:
        data = _cloudpickle.dumps(value, protocol=5, buffer_callback=bufs.append)
    elif _defined_in_cell(value):
        raise TypeError("defined in a cell: install cloudpickle in the kernel's interpreter to keep it")
    else:
        data = pickle.dumps(value, protocol=5, buffer_callback=bufs.append)
    views = [b.raw() for b in bufs]
    return data, views


class _Capped:
    """A file's writes, refused past `most` bytes (a remote kernel's
    snapshot file: no host pump counts them there)."""

    def __init__(self, f, most):
        self.f, self.most, self.n = f, most, 0

    def write(self, b):
        self.n += memoryview(b).nbytes
        if self.n > self.most:
            raise OverflowError("the state is over the snapshot cap of %d MiB" % (self.most >> 20))
        return self.f.write(b)


def take_file(ns, path, most):
    """A remote kernel's snapshot: `ns` into the regular file `path` (0600,
    written beside it and renamed into place), at most `most` bytes; the
    summary says how many were written."""
    tmp = path + ".tmp"
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with open(fd, "wb", buffering=1 << 20) as f:
            out = _Capped(f, most)
            summary = _take_to(ns, out)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # No snapshot stands for this state: an older one must not either.
        for stale in (tmp, path):
            try:
                os.unlink(stale)
            except OSError:
                pass
        raise
    summary["bytes"] = out.n
    return summary


def load_file(ns, path):
    """Load a remote kernel's snapshot file, then remove it (consumed)."""
    try:
        return load(ns, path)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def take(ns, path):
    """Write the snapshot of `ns` to `path`; returns the reply's summary."""
    with open(path, "wb", buffering=1 << 20) as out:
        return _take_to(ns, out)


def _take_to(ns, out):
    names, skipped, records = 0, [], 0
    out.write(MAGIC)
    header = {
        "python": list(sys.version_info[:2]),
        "pickler": "cloudpickle" if _cloudpickle is not None else "pickle",
    }
    pickle.dump(header, out, protocol=pickle.HIGHEST_PROTOCOL)
    for name, value in _user_names(ns):
        if isinstance(value, types.ModuleType):
            pickle.dump(("m", name, value.__name__), out, protocol=pickle.HIGHEST_PROTOCOL)
        else:
            try:
                data, views = _dumps(value)
            except BaseException as e:  # pickling runs user code: anything
                if isinstance(e, KeyboardInterrupt):
                    raise
                if len(skipped) < _MAX_SKIPPED:
                    skipped.append({"name": name, "type": _type_name(value), "why": _why(e)})
                continue
            sizes = [len(data)] + [v.nbytes for v in views]
            pickle.dump(("v", name, sizes), out, protocol=pickle.HIGHEST_PROTOCOL)
            out.write(data)
            for v in views:
                out.write(v)
            data = views = None
        names += 1
        records += 1
    pickle.dump(("end", records), out, protocol=pickle.HIGHEST_PROTOCOL)
    return {"names": names, "skipped": skipped}


def _rebind(value, ns):
    """A function (or a cell class's methods) made to see `ns` as its
    globals: a restored `def f(x): return x + n` sees the session's `n`."""
    if isinstance(value, types.FunctionType) and value.__globals__ is not ns:
        if value.__module__ != "__main__":
            return value
        f = types.FunctionType(value.__code__, ns, value.__name__, value.__defaults__, value.__closure__)
        f.__kwdefaults__ = value.__kwdefaults__
        f.__qualname__ = value.__qualname__
        f.__doc__ = value.__doc__
        f.__dict__.update(value.__dict__)
        f.__annotations__ = value.__annotations__
        f.__module__ = value.__module__
        return f
    if isinstance(value, type) and value.__module__ == "__main__":
        for attr, member in list(vars(value).items()):
            if isinstance(member, types.FunctionType):
                setattr(value, attr, _rebind(member, ns))
            elif isinstance(member, (staticmethod, classmethod)) and isinstance(
                member.__func__, types.FunctionType
            ):
                setattr(value, attr, type(member)(_rebind(member.__func__, ns)))
    return value


def _read_exactly(src, n):
    data = src.read(n)
    if len(data) != n:
        raise ValueError("the snapshot is truncated")
    return data


def _read_into(src, n):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = src.readinto(view[got:])
        if not k:
            raise ValueError("the snapshot is truncated")
        got += k
    return buf


def load(ns, path):
    """Load the snapshot at `path` into `ns`; returns the reply's summary.
    A stream from another Python, or one that is not a snapshot, raises
    (the host then reports the state as lost, with the reason)."""
    before = {}  # what each loaded name held before: put back on failure
    try:
        return _load(ns, path, before)
    except BaseException:
        # A stream cut short, a corrupt record or an interrupt: the
        # namespace is left as it was, never half restored.
        for name, old in before.items():
            if old is _MISSING:
                ns.pop(name, None)
            else:
                ns[name] = old
        raise


_MISSING = object()


def _load(ns, path, before):
    names, skipped = 0, []
    loads = _cloudpickle.loads if _cloudpickle is not None else pickle.loads
    with open(path, "rb", buffering=1 << 20) as src:
        if src.read(len(MAGIC)) != MAGIC:
            raise ValueError("not a cellhost snapshot (the file is corrupt or truncated)")
        header = pickle.load(src)
        want = list(sys.version_info[:2])
        if header.get("python") != want:
            raise ValueError(
                "the snapshot was taken by Python %s, this kernel runs %s"
                % (".".join(map(str, header.get("python") or [])), ".".join(map(str, want)))
            )
        records = 0
        while True:
            try:
                rec = pickle.load(src)
            except EOFError:
                raise ValueError("the snapshot is truncated (%d records read)" % records)
            if rec[0] == "end":
                if rec[1] != records:
                    raise ValueError("the snapshot is corrupt (%d of %d records)" % (records, rec[1]))
                break
            records += 1
            kind, name = rec[0], rec[1]
            if kind == "v":
                # Read whole before loading: a short stream ends the load,
                # a value that fails to load skips only itself. Buffers
                # land in memory of their own, which the loaded objects
                # (numpy arrays) then use without a copy.
                sizes = rec[2]
                data = _read_exactly(src, sizes[0])
                bufs = [_read_into(src, n) for n in sizes[1:]]
            if name not in before:
                before[name] = ns.get(name, _MISSING)
            try:
                if kind == "m":
                    __import__(rec[2])
                    ns[name] = sys.modules[rec[2]]
                else:
                    ns[name] = _rebind(loads(data, buffers=bufs), ns)
                    data = bufs = None
                names += 1
            except BaseException as e:
                if isinstance(e, KeyboardInterrupt):
                    raise
                if len(skipped) < _MAX_SKIPPED:
                    what = "module" if kind == "m" else "unknown"
                    skipped.append({"name": name, "type": what, "why": _why(e)})
            rec = None
    # Functions restored before the globals they name see them now: they
    # all share `ns`. Classes restored by value keep their identity
    # (cloudpickle tracks them), so instances stay instances of them.
    return {"names": names, "skipped": skipped}
