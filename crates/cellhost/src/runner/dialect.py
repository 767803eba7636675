# cellhost kernel runner: the agent's dialect (IPython's `!cmd`, `%magic`
# and `%%cell` escapes), rewritten into plain Python before a cell compiles.
# Stdlib only, Python >= 3.8; builtin imports only (loaded on the first cell
# that may have an escape, see `_has_escapes` in compile.py).
#
# Only lines that start a statement are escapes, as in IPython: a scan that
# knows strings (single, triple, prefixed), comments, brackets and
# backslash continuations tells those lines apart, so `a % b`, `x != y`,
# `"%d" % n`, and a line starting with `!` or `%` inside a multi-line string
# or a bracket are never touched. Each escape line becomes one line of
# Python (the same indentation), so line numbers, and so tracebacks, stay
# those of the cell as written. The calls go to `__cellhost__` (magics.py,
# put into builtins by the runner):
#
#   !cmd              __cellhost__.system('cmd')
#   !!cmd             __cellhost__.getoutput('cmd')          (a value)
#   x = !cmd          x = __cellhost__.getoutput('cmd')
#   %pip ARGS         __cellhost__.pip('ARGS')   (also !pip, !pip3, !python -m pip)
#   %name ARGS        __cellhost__.line_magic('name', 'ARGS')
#   x = %name ARGS    x = __cellhost__.line_magic('name', 'ARGS')
#   %%name ARGS       __cellhost__.cell_magic('name', 'ARGS', 'BODY')
#                     (first line of the cell; the body is not Python)
#
# A `%` escape that names no supported magic is a SyntaxError (on its own
# line) that names the supported ones.

LINE_MAGICS = ("pip", "cd", "pwd", "env", "time", "timeit", "who", "matplotlib")
CELL_MAGICS = ("bash", "sh", "writefile", "time", "timeit")
SUPPORTED = (
    "!cmd, x = !cmd, %pip install|uninstall|list|show, "
    + ", ".join("%" + m for m in LINE_MAGICS[1:])
    + ", and the cell magics "
    + ", ".join("%%" + m for m in CELL_MAGICS)
)
# What the error says instead, for magics people expect.
_INSTEAD = {
    "conda": "conda is not available here; install packages with %pip install NAME",
    "mamba": "mamba is not available here; install packages with %pip install NAME",
    "load_ext": "extensions are not supported; import the module instead",
    "autoreload": "autoreload is not supported; use importlib.reload(module)",
    "run": "%run is not supported; use exec(open(PATH).read())",
    "ls": "use !ls",
    "cat": "use !cat FILE",
    "mkdir": "use !mkdir DIR",
    "rm": "use !rm FILE",
    "capture": "%%capture is not supported; the cell's output is captured anyway",
    "html": "use display(HTML(...)) from IPython.display, or print()",
}
_OPEN = "([{"
_CLOSE = ")]}"
_PREFIX = frozenset("rRbBuUfF")


def _strip_redirects(rest):
    """(`pip ...` without its trailing redirections to /dev/null, the
    streams they silence: 1 stdout, 2 stderr, 3 both)."""
    words = rest.split()
    # Join `> /dev/null` into one word, then take the trailing redirections.
    joined = []
    for w in words:
        if w == "/dev/null" and joined and joined[-1] in (">", "1>", "2>", "&>"):
            joined[-1] += w
        else:
            joined.append(w)
    k = len(joined)
    while k and (joined[k - 1] == "2>&1" or joined[k - 1].endswith(">/dev/null")):
        k -= 1
    out = err = False
    for w in joined[k:]:  # in the shell's order
        if w == "2>&1":
            err = out
        elif w[0] == "2":
            err = True
        elif w[0] == "&":
            out = err = True
        else:
            out = True
    return " ".join(joined[:k]), (1 if out else 0) | (2 if err else 0)


def _pip_args(cmd):
    """(pip's argument line, silenced streams) of a shell command that only
    runs pip, else None."""
    words = cmd.split(None, 3)
    if not words:
        return None
    first = words[0]
    if first in ("pip", "pip3"):
        rest = cmd.split(None, 1)[1] if len(words) > 1 else ""
    elif (
        first in ("python", "python3", "{sys.executable}", "$PYTHON")
        or (first.startswith("python3.") and first[8:].isdigit())
    ) and words[1:3] == ["-m", "pip"]:
        rest = words[3] if len(words) > 3 else ""
    else:
        return None
    quiet = 0
    for ch in ";&|<>`\n":
        if ch in rest:
            rest, quiet = _strip_redirects(rest)
            break
    for ch in ";&|<>`\n":
        if ch in rest:
            return None  # a pipeline or a list: the shell runs it
    if "$(" in rest:
        return None
    return rest.strip(), quiet


def _error(msg, filename, lineno, line):
    return SyntaxError(msg, (filename, lineno, len(line) - len(line.lstrip()) + 1, line))


def _magic_call(body, filename, lineno, line):
    """`name args` of a `%` escape as a call expression."""
    name, _, args = body.partition(" ")
    if "\t" in name:
        name, _, more = name.partition("\t")
        args = more + " " + args if args else more
    args = args.strip()
    if name == "pip" or name == "pip3":
        return "__cellhost__.pip(%r)" % args
    if name in LINE_MAGICS:
        return "__cellhost__.line_magic(%r, %r)" % (name, args)
    if name.startswith("%"):
        raise _error(
            "the cell magic %%%%%s must be on the first line of the cell" % name[1:]
            if name[1:]
            else "empty cell magic",
            filename,
            lineno,
            line,
        )
    why = _INSTEAD.get(name)
    raise _error(
        "unsupported magic %%%s%s; cellhost supports %s"
        % (name, " (" + why + ")" if why else "", SUPPORTED),
        filename,
        lineno,
        line,
    )


def _escape_call(stripped, filename, lineno, line):
    """The call a `!` or `%` escape line (without its indent) becomes."""
    if stripped[0] == "!":
        if stripped[1:2] == "!":
            return "__cellhost__.getoutput(%r)" % stripped[2:]
        cmd = stripped[1:]
        pip = _pip_args(cmd.strip())
        if pip is not None:
            line, quiet = pip
            if quiet:
                return "__cellhost__.pip(%r, %d)" % (line, quiet)
            return "__cellhost__.pip(%r)" % line
        return "__cellhost__.system(%r)" % cmd
    return _magic_call(stripped[1:], filename, lineno, line)


def _assignment(stripped):
    """(targets, escape) for `targets = !cmd` / `targets = %magic`, else None.

    Targets: names, attributes, subscripts and tuples of them, as IPython's
    `SystemAssign` allows; never valid Python as a whole, so nothing valid
    is taken for one."""
    i = stripped.find("=")
    if i <= 0:
        return None
    rest = stripped[i + 1 :].lstrip()
    if rest[:1] not in ("!", "%") or rest[:2] == "%%":
        return None
    targets = stripped[:i].rstrip()
    if not targets or targets[-1] in "!<>=:+-*/%&|^@~":
        return None
    # The `=` must be the assignment's, not one inside a string or a
    # bracket: the targets alone must be valid targets.
    try:
        compile(targets + " = None", "<targets>", "exec")
    except (SyntaxError, ValueError):
        return None
    return targets, rest


class _Scanner:
    """Python's lexical state across physical lines: open string (its
    quote), bracket depth, and a trailing backslash."""

    __slots__ = ("quote", "depth", "continued")

    def __init__(self):
        self.quote = None
        self.depth = 0
        self.continued = False

    def at_statement_start(self):
        return self.quote is None and self.depth == 0 and not self.continued

    def feed(self, line):
        """Advance over one physical line (without its newline)."""
        self.continued = False
        if line.endswith("\r"):
            line = line[:-1]
        i = 0
        n = len(line)
        quote = self.quote
        if quote is not None:
            i = self._close(line, 0, quote)
            if i < 0:
                return
        while i < n:
            ch = line[i]
            if ch == "#":
                break
            if ch == '"' or ch == "'":
                q = line[i : i + 3] if line[i : i + 3] in ('"""', "'''") else ch
                i = self._close(line, i + len(q), q)
                if i < 0:
                    return
                continue
            if ch in _OPEN:
                self.depth += 1
            elif ch in _CLOSE:
                if self.depth > 0:
                    self.depth -= 1
            elif ch == "\\" and i == n - 1:
                self.continued = True
            i += 1

    def _close(self, line, i, quote):
        """Index after the string closing `quote` from `i` on this line;
        -1 when the string goes on to the next line (`self.quote` set)."""
        n = len(line)
        while i < n:
            ch = line[i]
            if ch == "\\":
                if i == n - 1:  # an escaped newline: the string goes on
                    self.quote = quote
                    return -1
                i += 2  # an escaped char (raw strings too) never closes
                continue
            if line.startswith(quote, i):
                self.quote = None
                return i + len(quote)
            i += 1
        # A triple-quoted string goes on; an unterminated '...' is an error
        # compile will report.
        self.quote = quote if len(quote) == 3 else None
        return -1


def _cell_magic(lines, first, filename):
    head = lines[first].strip()
    name, _, args = head[2:].partition(" ")
    if name not in CELL_MAGICS:
        why = _INSTEAD.get(name)
        raise _error(
            "unsupported cell magic %%%%%s%s; cellhost supports %s"
            % (name, " (" + why + ")" if why else "", SUPPORTED),
            filename,
            first + 1,
            lines[first],
        )
    body = "\n".join(lines[first + 1 :])
    # One line of Python where the magic was; the rest are blank, so the
    # cell keeps its line count.
    return "\n" * first + "__cellhost__.cell_magic(%r, %r, %r)" % (name, args.strip(), body) + "\n" * (
        len(lines) - first - 1
    )


def transform(code, filename="<cell>"):
    """The cell as plain Python; `code` itself (the same object) when it has
    no escape. Raises SyntaxError for an unsupported magic."""
    lines = code.split("\n")
    first = 0
    while first < len(lines) and not lines[first].strip():
        first += 1
    if first < len(lines) and lines[first].startswith("%%"):
        return _cell_magic(lines, first, filename)
    scan = _Scanner()
    changed = False
    for no, line in enumerate(lines):
        if scan.at_statement_start():
            stripped = line.lstrip()
            c = stripped[:1]
            if c == "!" or c == "%":
                indent = line[: len(line) - len(stripped)]
                lines[no] = indent + _escape_call(stripped.rstrip("\r"), filename, no + 1, line)
                changed = True
                continue
            if "=" in stripped and ("!" in stripped or "%" in stripped):
                found = _assignment(stripped)
                if found is not None:
                    targets, rest = found
                    indent = line[: len(line) - len(stripped)]
                    rest = rest.rstrip("\r")
                    if rest[0] == "!":  # the output's lines, as IPython's SystemAssign
                        call = "__cellhost__.getoutput(%r)" % rest.lstrip("!")
                    else:
                        call = _magic_call(rest[1:], filename, no + 1, line)
                    lines[no] = "%s%s = %s" % (indent, targets, call)
                    changed = True
                    continue
        scan.feed(line)
    return "\n".join(lines) if changed else code
