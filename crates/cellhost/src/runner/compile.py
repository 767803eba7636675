# cellhost kernel runner, part 1 of 7: splitting a cell into its statements
# and its last expression, and capping text. The host ships this file,
# limits.py, helpers.py, warmup.py, frames.py, streams.py and runner.py
# joined into one script (this part first): see RUNNER_SOURCE in
# kernel/process.rs. Stdlib only, Python >= 3.8; builtin imports only.

import _ast


def _cap(text, limit):
    data = text.encode("utf-8", "surrogateescape")
    if len(data) <= limit:
        return text
    head = limit * 2 // 5
    tail = limit - head
    cut = len(data) - head - tail
    return (
        data[:head].decode("utf-8", "replace")
        + "\n[... %d bytes of the value cut ...]\n" % cut
        + data[-tail:].decode("utf-8", "replace")
    )


# First words of one-line statements that can never be an expression.
_STATEMENT_WORDS = frozenset(
    "import from del pass global nonlocal raise assert return break continue "
    "for while if with try def class async".split()
)
_NOT_BEFORE_EQ = tuple("!<>=:+-*/%&|^@~")


def _is_plain_assignment(line):
    """`a = ...`, `a.b = ...` or `a, b = ...`: certainly not an expression."""
    i = line.find("=")
    if i <= 0 or line[i + 1 : i + 2] == "=":
        return False
    left = line[:i].rstrip()
    if not left or left.endswith(_NOT_BEFORE_EQ):
        return False
    for target in left.split(","):
        for part in target.strip().split("."):
            if not part.isidentifier():
                return False
    return True


def _compile_cell(code, filename):
    """(statements, last_expression): code objects, either may be None.

    The last expression statement's value is the cell's value, so it is
    compiled apart. The common shape is cheap: when everything before the
    last line compiles on its own and the last line starts at column 0, the
    last line is a statement of its own, so it is compiled alone (as an
    expression when it is one). Anything else (an indented or continued last
    line, a last line that only makes sense with the lines above, like
    `else:`) is split on the AST, which costs about twice as much.
    """
    text = code.rstrip()
    cut = text.rfind("\n")
    last = text[cut + 1 :] if cut >= 0 else text
    if last and not last[0].isspace() and last[0] != "#" and ";" not in last:
        try:
            head = compile(text[:cut], filename, "exec") if cut >= 0 else None
        except SyntaxError:
            pass
        else:
            # Same line numbers as in the whole cell, for tracebacks.
            tail = "\n" * text.count("\n", 0, cut + 1) + last if cut >= 0 else last
            word = last.split(None, 1)[0]
            try:
                if word in _STATEMENT_WORDS or _is_plain_assignment(last):
                    return head, None, compile(tail, filename, "exec")
                try:
                    return head, compile(tail, filename, "eval"), None
                except SyntaxError:
                    return head, None, compile(tail, filename, "exec")
            except SyntaxError:
                pass  # e.g. `else: ...`: only the whole cell tells
    tree = compile(code, filename, "exec", _ast.PyCF_ONLY_AST)
    body = tree.body
    last = None
    if body and type(body[-1]) is _ast.Expr:
        last = compile(_ast.Expression(body.pop().value), filename, "eval")
    return (compile(tree, filename, "exec") if body else None), last, None




def _has_escapes(code):
    """Whether a line may start with `!` or `%`, or have one right after an
    `=` (`files = !ls`): only then does the dialect's transform
    (dialect.py) look at the cell. Two `find`s for cells with neither
    character, a glance at the char before each occurrence otherwise.
    False positives (`"a=%d" % x`) only cost the transform's scan."""
    for ch in "!%":
        i = code.find(ch)
        while i >= 0:
            nxt = code[i + 1 : i + 2]
            # `x != y` and `a % b` at a glance: an escape's `!` is not
            # followed by `=`, a magic's `%` by a space.
            if (nxt == "=" if ch == "!" else nxt == " ") or i and code[i - 1] not in "\n= \t":
                i = code.find(ch, i + 1)
                continue
            if i == 0:
                return True
            prev = code[i - 1]
            if prev == "\n" or prev == "=":
                return True
            if prev == " " or prev == "\t":
                head = code[code.rfind("\n", 0, i) + 1 : i].rstrip(" \t")
                if not head or head[-1] == "=":
                    return True
            i = code.find(ch, i + 1)
    return False
