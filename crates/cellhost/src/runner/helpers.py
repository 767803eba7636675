# cellhost kernel runner, part 3 of 7 (compile.py and limits.py come first,
# warmup.py, frames.py, streams.py and runner.py last, in one shipped
# script): the runner's side of the agent's dialect. The dialect's modules
# are files of their own next to the script (dialect.py: the transform;
# magics.py: what escapes run; hints.py: a sentence for an error;
# pipmagic.py: %pip), read at start (as display.py is: a cell may remove the
# staging dir) and compiled on first use, so a cell without escapes never
# loads them. Builtin imports only.

import builtins
import os
import sys

# snapshot.py: the snapshot ops; strictfork.py: the sandbox of a strict
# template's forks; (pipmagic.py: runner.py's _PipMagicHook)
_HELPERS = ("dialect", "magics", "hints", "snapshot", "strictfork")
_helper_sources = {}  # read at start, as display.py
_helpers = {}
_hidden_files = set()  # frames tracebacks leave out: the runner's and the helpers'
_shell_groups = set()  # process groups of the `!` commands running now
_network = None  # the kernel's network mode, from the host (--network=)
_runtime = type(sys)("_cellhost_runtime")  # what the helpers may use of the runner


def _helper(name):
    """One of the dialect's modules, compiled on first use."""
    mod = _helpers.get(name)
    if mod is None:
        source = _helper_sources.get(name)
        if source is None:
            raise RuntimeError("cellhost: the runner's %s.py could not be read at start" % name)
        path = os.path.join(os.path.dirname(_runner_file), name + ".py")
        mod = type(sys)("_cellhost_" + name)
        mod.__file__ = path
        mod._runtime = _runtime
        _hidden_files.add(path)
        exec(compile(source, path, "exec"), mod.__dict__)
        _helpers[name] = mod
    return mod


def _transform(code, filename):
    """The cell with its `!`/`%` escapes turned into Python (dialect.py)."""
    out = _helper("dialect").transform(code, filename)
    if out is not code and getattr(builtins, "__cellhost__", None) is None:
        builtins.__cellhost__ = _helper("magics")
    return out


def _hint_of(e):
    try:
        return _helper("hints").hint(e, _network)
    except Exception:
        return None


def _setup_helpers():
    _hidden_files.add(_runner_file)
    _hidden_files.add("<cellhost pipmagic>")
    d = os.path.dirname(_runner_file)
    for name in _HELPERS:
        try:
            with open(os.path.join(d, name + ".py"), "rb") as f:
                _helper_sources[name] = f.read()
        except OSError:
            pass
    _runtime.load = _helper
    _runtime.transform = _transform
    _runtime.compile_cell = _compile_cell
    _runtime.shell_groups = _shell_groups
    _runtime._send = _send
    _runtime._encode = _encode


def _user_frames(tb):
    """The traceback without the runner's and its helpers' frames, wherever
    they are (a `%time` runs the cell's code under magics.py)."""
    head = last = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename not in _hidden_files:
            if last is None:
                head = tb
            else:
                last.tb_next = tb
            last = tb
        tb = tb.tb_next
    if last is not None:
        last.tb_next = None
    return head
