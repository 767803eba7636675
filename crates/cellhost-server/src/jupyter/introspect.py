# cellhost Jupyter introspection, run as a hidden cell in the session's
# kernel: exec'd with `_ns` (the cell namespace) and `_req` (a JSON
# request). It prints one line, MARKER + JSON answer, and defines nothing
# in the namespace. Stdlib only (Python >= 3.8).
import json as _json


def _answer(ns, req):
    import keyword
    import re

    code = req.get("code", "")
    pos = req.get("cursor_pos")
    if not isinstance(pos, int) or pos < 0 or pos > len(code):
        pos = len(code)
    kind = req.get("kind")

    if kind == "is_complete":
        import codeop

        try:
            compiled = codeop.compile_command(code, "<cell>", "exec")
        except (SyntaxError, OverflowError, ValueError):
            return {"status": "invalid"}
        if compiled is None:
            last = code.rstrip("\n").split("\n")[-1] if code.strip() else ""
            indent = last[: len(last) - len(last.lstrip())]
            if last.rstrip().endswith(":"):
                indent += "    "
            return {"status": "incomplete", "indent": indent}
        return {"status": "complete"}

    if kind == "complete":
        import rlcompleter

        before = code[:pos]
        token = re.search(r"[A-Za-z_][\w.]*$|$", before).group(0)
        completer = rlcompleter.Completer(ns)
        matches = []
        seen = set()
        for i in range(1000):
            try:
                m = completer.complete(token, i)
            except Exception:
                break
            if m is None:
                break
            if m.endswith("()"):
                m = m[:-2]
            elif m.endswith("("):
                m = m[:-1]
            if m not in seen:
                seen.add(m)
                matches.append(m)
        if not token:
            matches = [m for m in matches if not m.startswith("_")]
        return {
            "status": "ok",
            "matches": matches[:500],
            "cursor_start": pos - len(token),
            "cursor_end": pos,
            "metadata": {},
        }

    if kind == "inspect":
        import inspect

        start = pos
        while start > 0 and (code[start - 1].isalnum() or code[start - 1] in "_."):
            start -= 1
        end = pos
        while end < len(code) and (code[end].isalnum() or code[end] == "_"):
            end += 1
        name = code[start:end].strip(".")
        if not name and start > 0 and code[start - 1] == "(":
            # Right after `f(`: inspect `f`.
            return _answer(ns, dict(req, cursor_pos=start - 1))
        parts = name.split(".")
        if not name or not all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
            return {"status": "ok", "found": False, "data": {}, "metadata": {}}
        import builtins

        if parts[0] in ns:
            obj = ns[parts[0]]
        elif hasattr(builtins, parts[0]):
            obj = getattr(builtins, parts[0])
        else:
            return {"status": "ok", "found": False, "data": {}, "metadata": {}}
        try:
            for p in parts[1:]:
                obj = getattr(obj, p)
        except Exception:
            return {"status": "ok", "found": False, "data": {}, "metadata": {}}
        lines = []
        try:
            sig = str(inspect.signature(obj))
            lines.append("Signature: " + name + sig)
        except (TypeError, ValueError):
            pass
        lines.append("Type:      " + type(obj).__name__)
        if not callable(obj) or inspect.isclass(type(obj)) and not inspect.isroutine(obj):
            r = repr(obj)
            lines.append("Value:     " + (r if len(r) <= 500 else r[:500] + "..."))
        doc = inspect.getdoc(obj)
        if doc:
            lines.append("Docstring:\n" + doc)
        if req.get("detail_level", 0) >= 1:
            try:
                lines.append("Source:\n" + inspect.getsource(obj))
            except (TypeError, OSError):
                pass
        return {
            "status": "ok",
            "found": True,
            "data": {"text/plain": "\n".join(lines)},
            "metadata": {},
        }

    return {"status": "error", "ename": "ValueError", "evalue": "unknown kind %r" % (kind,), "traceback": []}


try:
    _out = _answer(_ns, _json.loads(_req))
except Exception as _e:  # never let introspection raise into the kernel
    _out = {"status": "error", "ename": type(_e).__name__, "evalue": str(_e), "traceback": []}
print(_marker + _json.dumps(_out))
