"""Property test of the dialect's transform (runner/dialect.py), driven by
tests/kernel_dialect_property.rs.

Random valid Python that has no `!`/`%` escape at a statement start, but
plenty of `%` and `!` elsewhere (`a % b`, `x != y`, `"%d" % n`, f-string
`!r` conversions, comments, dict/set comprehensions, continuation lines
inside brackets or after a backslash that start with `%` or `!=`, and
multi-line strings whose lines start with `!`, `%` or `%%`), must come out
of the transform unchanged. And an escape inserted at a real statement
start must be transformed on exactly that line, the line count kept.

    python dialect_property.py DIALECT_PY check CASES SEED
        exit 0, or print the first failing program and exit 1
    python dialect_property.py DIALECT_PY sample CASES SEED
        print a JSON list of [program, fingerprint]: what plain exec of the
        program leaves in its namespace (the test runs each in a kernel)
"""

import json
import random
import sys

# A fingerprint of a namespace: every value is an int, a str, a bool, a
# tuple, a dict or a set of ints, so the reprs are deterministic.
FINGERPRINT = (
    "repr(sorted((k, repr(v)) for k, v in dict(globals()).items() "
    "if not k.startswith('_') and k != 'display'))"
)


class Gen:
    def __init__(self, rng):
        self.r = rng
        self.names = ["a", "b"]
        self.n = 0

    def name(self):
        self.n += 1
        return "v%d" % self.n

    def atom(self):
        r = self.r
        c = r.randrange(6)
        if c == 0:
            return str(r.randrange(1, 50))
        if c == 1:
            return r.choice(self.names)
        if c == 2:
            return repr(r.choice(["!", "%", "%d!", "x=%s", "!ls", "%%bash", "a % b", "!="]))
        if c == 3:
            return "(%s %% %d)" % (r.choice(self.names), r.randrange(1, 9))
        if c == 4:
            return "len(%r)" % r.choice(["!x", "%y", ""])
        return "%s" % r.randrange(100)

    def expr(self, depth=0):
        r = self.r
        if depth > 2:
            return self.atom()
        c = r.randrange(12)
        a, b = self.expr(depth + 1), self.expr(depth + 1)
        if c == 0:
            return "%s %% %s" % (a, "(%s or 1)" % b)
        if c == 1:
            return "(%s != %s)" % (a, b)
        if c == 2:
            return "'%%s-%%s!' %% (%s, %s)" % (a, b)
        if c == 3:
            return "{k: k %% 3 for k in range(%d)}" % r.randrange(5)
        if c == 4:
            return "{k %% 4 for k in range(%d)}" % r.randrange(1, 9)
        if c == 5:
            # Python < 3.12 takes no quotes nor newlines inside an f-string's braces.
            x, y = r.choice(self.names), r.randrange(9)
            return "f'{%s!r}-{%s %% 3}-{%s=!s}'" % (x, y, x)
        if c == 6:
            # A bracket whose continuation lines start with `%`, `!=` or a string.
            return "(%s\n    %% 7\n    != %s)" % (a, b)
        if c == 7:
            return "[%s,\n%s,\n  '!x']" % (a, b)
        if c == 8:
            return "((%s) if (%s) != 0 else (%s))" % (a, b, a)
        if c == 9:
            return '"%%d%%%%" %% (%s or 0,)' % a
        if c == 10:
            return "%s" % a
        return "(%s + %s)" % (a, b)

    def string_block(self):
        r = self.r
        q = r.choice(['"""', "'''"])
        prefix = r.choice(["", "r", "b", "f", "rb", "R", "u"])
        lines = [r.choice(["!ls -la", "%pip install x", "%%bash", "  !indented", "% 3", "!= 1", "x = !ls", "plain", "", "%time x"]) for _ in range(r.randrange(1, 4))]
        if prefix.startswith(("f", "F")):
            lines = [l.replace("{", "{{").replace("}", "}}") for l in lines]
        body = "\n".join(lines)
        if "b" in prefix.lower():
            return "%s%s\n%s\n%s" % (prefix, q, body, q)
        return "%s%s\n%s\n%s" % (prefix, q, body, q)

    def statement(self, indent, depth):
        r = self.r
        pad = "    " * indent
        c = r.randrange(11 if depth < 2 else 7)
        if c == 0:
            v = self.name()
            self.names.append(v)
            return "%s%s = %s" % (pad, v, self.expr())
        if c == 1:
            v = self.name()
            self.names.append(v)
            return "%s%s = %s" % (pad, v, self.string_block())
        if c == 2:
            return "%s# %s" % (pad, r.choice(["!ls", "%pip install x", "a % b", "!= and %%"]))
        if c == 3:
            v = self.name()
            self.names.append(v)
            # A backslash continuation whose next line starts with `%`.
            return "%s%s = %s \\\n%% 5" % (pad, v, self.atom())
        if c == 4:
            v = self.name()
            self.names.append(v)
            return "%s%s = '!' + \"%%\" + '\\'' + \"\\\"\"  # !comment" % (pad, v)
        if c == 5:
            return "%s%s" % (pad, self.expr())
        if c == 6:
            v = self.name()
            self.names.append(v)
            return "%s%s = (%s\n%s)" % (pad, v, self.string_block(), pad)
        if c == 7:
            return "%sif %s != 0:\n%s" % (pad, self.atom(), self.block(indent + 1, depth + 1))
        if c == 8:
            return "%sfor _i in range(2):\n%s" % (pad, self.block(indent + 1, depth + 1))
        if c == 9:
            return "%sdef _f%d():\n%s\n%s_f%d()" % (
                pad, self.n, self.block(indent + 1, depth + 1, ret=True), pad, self.n)
        return "%swhile False:\n%s" % (pad, self.block(indent + 1, depth + 1))

    def block(self, indent, depth, ret=False):
        saved = list(self.names)
        out = [self.statement(indent, depth) for _ in range(self.r.randrange(1, 3))]
        out.append("    " * indent + "pass")  # a block of only a comment is no block
        if ret:
            out.append("    " * indent + "return %s" % self.atom())
            self.names = saved  # locals of the function are not globals
        return "\n".join(out)

    def program(self):
        head = "a, b = %d, %d" % (self.r.randrange(1, 9), self.r.randrange(1, 9))
        body = [self.statement(0, 0) for _ in range(self.r.randrange(1, 7))]
        return "\n".join([head] + body)


def statement_starts(code):
    """Line numbers (0-based) that start a statement, from the tokenizer."""
    import io
    import tokenize

    starts = set()
    new = True
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT):
            if tok.type == tokenize.NEWLINE:
                new = True
            continue
        if tok.type in (tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER):
            continue
        if new:
            starts.add(tok.start[0] - 1)
            new = False
    return starts


def load(path):
    mod = type(sys)("dialect")
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), mod.__dict__)
    return mod


def check(dialect, cases, seed):
    rng = random.Random(seed)
    for case in range(cases):
        g = Gen(rng)
        code = g.program()
        compile(code, "<generated>", "exec")  # the generator makes valid Python
        try:
            out = dialect.transform(code, "<generated>")
        except SyntaxError as e:
            out = "SyntaxError: %s" % e
        if out != code:
            print("case %d (seed %d): valid Python was changed\n--- in\n%s\n--- out\n%s" % (case, seed, code, out))
            return 1
        # An escape at a real statement start is transformed there, alone.
        lines = code.split("\n")
        starts = sorted(statement_starts(code))
        at = rng.choice(starts)
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
        escape = rng.choice(["!echo hi", "%pwd", "x = !ls", "%pip install q"])
        mutated = lines[:at] + [indent + escape] + lines[at:]
        try:
            out = dialect.transform("\n".join(mutated), "<generated>").split("\n")
        except SyntaxError as e:
            out = ["SyntaxError: %s" % e]
        changed = [i for i, (x, y) in enumerate(zip(mutated, out)) if x != y]
        if len(out) != len(mutated) or changed != [at] or "__cellhost__." not in out[at]:
            print("case %d (seed %d): the escape on line %d was not (only) transformed\n--- in\n%s\n--- out\n%s"
                  % (case, seed, at + 1, "\n".join(mutated), "\n".join(out)))
            return 1
    print("ok %d cases" % cases)
    return 0


def sample(cases, seed):
    """Programs that run (and what they leave), for the kernel to run."""
    rng = random.Random(seed)
    out = []
    while len(out) < cases:
        code = Gen(rng).program()
        ns = {}
        try:
            exec(compile(code, "<generated>", "exec"), ns)
        except Exception:
            continue  # valid, but fails at run time (`'!' % 3`): not a sample
        ns.pop("__builtins__", None)
        fp = eval(FINGERPRINT, {"globals": lambda: ns})
        out.append([code, fp])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    path, mode, cases, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if mode == "check":
        sys.exit(check(load(path), cases, seed))
    sys.exit(sample(cases, seed))
