# cellhost kernel runner: what the agent's dialect runs. dialect.py turns
# `!cmd`, `%magic` and `%%magic` lines into calls of this module, which the
# runner puts into builtins as `__cellhost__` (see `_transform` in
# runner.py). Stdlib only, Python >= 3.8. Loaded on the first cell with an
# escape; `_runtime` (set by the runner before this runs) gives the
# runner's internals: `load` (another helper module), `compile_cell`,
# `transform`, `shell_groups`.
#
# Shell commands run through /bin/sh (`%%bash` through bash when there is
# one) in the kernel's cwd, with stdin /dev/null and the kernel's fds 1/2,
# so their output is the cell's, live, captured like any subprocess's. Each
# runs in a process group of its own: an interrupt (or a timeout's SIGINT)
# stops the whole command (SIGINT, then SIGKILL after half a second) and
# leaves the kernel and its state alone. The exit status goes into
# `_exit_code` in the cell's namespace.
#
# `{expr}` and `$name` in a command (and in line magic arguments, except
# %time/%timeit) are expanded as IPython's `var_expand` does: `{expr}` is
# evaluated in the caller's namespace, `$name` (and `$a.b`) too unless
# inside single quotes, `$$` is a literal `$`, `{{`/`}}` literal braces;
# when any of it fails (`$HOME` with no Python variable HOME, awk's
# `{print $1}`) the command runs exactly as written.

import os
import sys

_oldpwd = None
_formatter = None


class SList(list):
    """The lines of a command's output (`files = !ls`), as IPython's SList:
    a list of str with `.s` (space-joined), `.n` (newline-joined), `.l`."""

    @property
    def s(self):
        return " ".join(self)

    @property
    def n(self):
        return "\n".join(self)

    @property
    def l(self):  # noqa: E743  (IPython's name)
        return list(self)


def _namespace(frame):
    if frame.f_locals is frame.f_globals:
        return frame.f_globals
    ns = dict(frame.f_globals)
    ns.update(frame.f_locals)
    return ns


def _make_formatter():
    import re
    import string

    dollar = re.compile(r"(.*?)\$(\$?[\w\.]+)(?=([^']*'[^']*')*[^']*$)")

    class Formatter(string.Formatter):
        # IPython's DollarFormatter over its FullEvalFormatter.
        def parse(self, fmt):
            for literal, field, spec, conv in string.Formatter.parse(self, fmt):
                at = 0
                txt = ""
                for m in dollar.finditer(literal):
                    before, name = m.group(1, 2)
                    if name.startswith("$"):
                        txt += before + name
                    else:
                        yield (txt + before, name, "", None)
                        txt = ""
                    at = m.end()
                yield (txt + literal[at:], field, spec, conv)

        def vformat(self, fmt, args, kwargs):
            out = []
            for literal, field, spec, conv in self.parse(fmt):
                if literal:
                    out.append(literal)
                if field is not None:
                    if spec:
                        field = field + ":" + spec
                    obj = eval(field, kwargs)
                    out.append(self.format_field(self.convert_field(obj, conv), ""))
            return "".join(out)

    return Formatter()


def expand(text, frame):
    """`text` with `{expr}` and `$name` expanded in `frame`'s namespace;
    `text` itself when any of it fails."""
    global _formatter
    if "{" not in text and "$" not in text:
        return text
    if _formatter is None:
        _formatter = _make_formatter()
    ns = _namespace(frame)
    if ns is frame.f_globals:
        ns = dict(ns)  # eval may add __builtins__; never into the cell's dict
    try:
        return _formatter.vformat(text, (), ns)
    except Exception:
        return text


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def _stop(p):
    """Stop a command's whole process group: SIGINT, then SIGKILL."""
    import signal

    for sig, grace in ((signal.SIGINT, 0.5), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except OSError:
            pass
        try:
            p.wait(grace)
            return
        except BaseException:
            continue


def _shell(argv, capture):
    """Run `argv`; (status, captured bytes or None). IPython's statuses:
    a command killed by signal N (shell status 128+N) is -N."""
    import subprocess

    _flush()
    p = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.STDOUT if capture else None,
        start_new_session=True,
    )
    groups = _runtime.shell_groups
    groups.add(p.pid)
    try:
        if capture:
            out = p.communicate()[0]
        else:
            out = None
            p.wait()
    except BaseException:
        _stop(p)
        raise
    finally:
        groups.discard(p.pid)
    rc = p.returncode
    if rc > 128:
        rc = -(rc - 128)
    return rc, out


def _sh(cmd):
    return ["/bin/sh", "-c", cmd]


def system(cmd):
    """`!cmd`: run it, its output the cell's; the status in `_exit_code`."""
    frame = sys._getframe(1)
    rc, _ = _shell(_sh(expand(cmd, frame)), False)
    frame.f_globals["_exit_code"] = rc


def getoutput(cmd):
    """`x = !cmd`: its output (stdout and stderr) as a list of lines."""
    frame = sys._getframe(1)
    rc, out = _shell(_sh(expand(cmd, frame)), True)
    frame.f_globals["_exit_code"] = rc
    return SList(out.decode("utf-8", "replace").splitlines())


def pip(line, quiet=0):
    """`%pip ...` (and `!pip ...`): pipmagic.pip_magic on the expanded line;
    its status in `_exit_code`. `quiet`: the streams `!pip ... >/dev/null`
    silenced (1 stdout, 2 stderr, 3 both)."""
    frame = sys._getframe(1)
    line = expand(line, frame)
    import pipmagic  # the runner's import hook: the host-side install (pipmagic.py)

    pip_magic = pipmagic.pip_magic
    if not quiet:
        rc = pip_magic(line)
    else:
        _flush()
        fds = [fd for fd in (1, 2) if quiet & fd]
        saved = [os.dup(fd) for fd in fds]
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            for fd in fds:
                os.dup2(null, fd)
            rc = pip_magic(line)
        finally:
            _flush()
            for fd, copy in zip(fds, saved):
                os.dup2(copy, fd)
                os.close(copy)
            os.close(null)
    frame.f_globals["_exit_code"] = rc


def line_magic(name, args):
    frame = sys._getframe(1)
    if name == "time":
        return _time(args, frame)
    if name == "timeit":
        return _timeit(args, None, frame)
    return _LINE[name](expand(args, frame), frame)


def cell_magic(name, args, body):
    frame = sys._getframe(1)
    if body and not body.endswith("\n"):
        body += "\n"
    if name == "time":
        return _time(body, frame, "\n" * frame.f_lineno)
    if name == "timeit":
        return _timeit(args, body, frame)
    args = expand(args, frame)
    if name == "writefile":
        return _writefile(args, body)
    if args:
        print("cellhost: %%%%%s ignores its arguments (%s)" % (name, args), file=sys.stderr)
    shell = "/bin/sh"
    if name == "bash":
        for d in ("/bin", "/usr/bin", "/usr/local/bin"):
            if os.access(d + "/bash", os.X_OK):
                shell = d + "/bash"
                break
    rc, _ = _shell([shell, "-c", body], False)
    frame.f_globals["_exit_code"] = rc


def _unquote(s):
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return s


def _cd(args, frame):
    global _oldpwd
    quiet = False
    if args.startswith("-q ") or args == "-q":
        quiet, args = True, args[2:].strip()
    target = _unquote(args)
    if not target:
        target = os.path.expanduser("~")
    elif target == "-":
        if _oldpwd is None:
            raise ValueError("%cd -: there is no previous directory yet")
        target = _oldpwd
    before = os.getcwd()
    os.chdir(os.path.expanduser(target))
    _oldpwd = before
    if not quiet:
        print(os.getcwd())


def _pwd(args, frame):
    return os.getcwd()


def _env(args, frame):
    """%env: all variables (a dict); %env NAME: one; %env NAME=VALUE or
    %env NAME VALUE: set one."""
    args = args.strip()
    if not args:
        return dict(os.environ)
    head = args.split(None, 1)
    if "=" in head[0]:
        name, _, value = args.partition("=")
    elif len(head) == 2:
        name, value = head
    else:
        try:
            return os.environ[args]
        except KeyError:
            raise KeyError("the environment has no variable %s" % args) from None
    name, value = name.strip(), _unquote(value)
    os.environ[name] = value
    print("env: %s=%s" % (name, value))


def _who(args, frame):
    kinds = set(args.split())
    ns = frame.f_globals
    names = sorted(
        k
        for k, v in ns.items()
        if not k.startswith("_") and (not kinds or type(v).__name__ in kinds)
    )
    print("\t".join(names) if names else "Interactive namespace is empty.")


def _matplotlib(args, frame):
    if args not in ("", "inline"):
        print(
            "cellhost: %%matplotlib %s is not available; figures come back inline, as images in "
            "the cell's result" % args,
            file=sys.stderr,
        )


_LINE = {"cd": _cd, "pwd": _pwd, "env": _env, "who": _who, "matplotlib": _matplotlib}


def _writefile(args, body):
    words = args.split()
    append = False
    while words and words[0] in ("-a", "--append"):
        append = True
        words.pop(0)
    if not words:
        raise ValueError("%%writefile needs a file name: %%writefile [-a] FILE")
    path = os.path.expanduser(_unquote(" ".join(words)))
    exists = os.path.exists(path)
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        f.write(body)
    print(("Appending to %s" if append else "Overwriting %s" if exists else "Writing %s") % path)


def _format_time(seconds):
    """IPython's `_format_time`: three significant digits and a unit."""
    if seconds >= 60.0:
        parts = []
        for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
            n = int(seconds // size)
            if n:
                parts.append("%d%s" % (n, unit))
                seconds -= n * size
        parts.append("%.3gs" % seconds)
        return " ".join(parts)
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("\xb5s", 1e6), ("ns", 1e9)):
        if seconds >= 1.0 / scale or unit == "ns":
            return "%.3g %s" % (seconds * scale, unit)


def _time(src, frame, pad=None):
    """%time STATEMENT / %%time: run it once where it was written and say
    how long it took; the value of a last expression is returned."""
    import time

    if pad is None:
        pad = "\n" * (frame.f_lineno - 1)
    filename = frame.f_code.co_filename
    # Same file name and line numbers as the cell: tracebacks show the
    # cell's own lines.
    src = _runtime.transform(pad + src, filename)
    head, last, tail = _runtime.compile_cell(src, filename)
    g, loc = frame.f_globals, frame.f_locals
    t0, c0 = time.perf_counter(), os.times()
    value = None
    try:
        if head is not None:
            exec(head, g, loc)
        if tail is not None:
            exec(tail, g, loc)
        if last is not None:
            value = eval(last, g, loc)
    finally:
        wall, c1 = time.perf_counter() - t0, os.times()
        user, sys_ = c1[0] - c0[0], c1[1] - c0[1]
        print(
            "CPU times: user %s, sys: %s, total: %s\nWall time: %s"
            % (_format_time(user), _format_time(sys_), _format_time(user + sys_), _format_time(wall))
        )
    return value


class TimeitResult:
    """What `%timeit -o` returns (IPython's fields)."""

    def __init__(self, loops, repeat, all_runs):
        self.loops = loops
        self.repeat = repeat
        self.all_runs = all_runs
        self.timings = [t / loops for t in all_runs]
        self.best = min(self.timings)
        self.worst = max(self.timings)
        self.average = sum(self.timings) / len(self.timings)
        var = sum((t - self.average) ** 2 for t in self.timings) / len(self.timings)
        self.stdev = var**0.5

    def __repr__(self):
        return "%s \xb1 %s per loop (mean \xb1 std. dev. of %d run%s, %d loop%s each)" % (
            _format_time(self.average),
            _format_time(self.stdev),
            self.repeat,
            "" if self.repeat == 1 else "s",
            self.loops,
            "" if self.loops == 1 else "s",
        )


def _timeit(args, body, frame):
    """%timeit [-n N] [-r R] [-o] [-q] STATEMENT, or %%timeit [-n N] [-r R]
    [SETUP] over the cell's body: IPython's loop counts (enough loops for
    0.2 s, 7 runs) and summary line."""
    import time
    import timeit

    number, repeat, ret, quiet = 0, 7, False, False
    words = args.split()
    while words:
        w = words[0]
        if w in ("-n", "-r") and len(words) > 1 and words[1].isdigit():
            if w == "-n":
                number = int(words[1])
            else:
                repeat = max(1, int(words[1]))
            del words[:2]
        elif w in ("-o", "-q"):
            ret, quiet = ret or w == "-o", quiet or w == "-q"
            del words[0]
        else:
            break
    rest = " ".join(words)
    if body is None:
        stmt, setup = rest, "pass"
        if not stmt:
            raise ValueError("%timeit needs a statement: %timeit [-n N] [-r R] STATEMENT")
    else:
        stmt, setup = body, rest or "pass"
    timer = timeit.Timer(stmt, setup, timer=time.perf_counter, globals=_namespace(frame))
    if not number:
        for k in range(10):
            number = 10**k
            if timer.timeit(number) >= 0.2:
                break
    result = TimeitResult(number, repeat, timer.repeat(repeat, number))
    if not quiet:
        print(repr(result))
    return result if ret else None
