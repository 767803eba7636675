"""A cell result as a model reads it: the text the MCP server's
`execute_code` returns (crates/cellhost-mcp/src/render.rs), sentence for
sentence, so an agent gets the same words through this client as through
MCP. The client's tests check the two against each other on real results.
"""

from __future__ import annotations

from .results import CellResult, Status, _lines

#: Traceback lines a model gets (the innermost frames).
TRACEBACK_LINES = 20
#: Image types a model's tool result carries as images.
IMAGE_MIMES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def render(r: CellResult) -> str:
    """The text a model reads for a finished cell."""
    out: list[str] = []
    sentence = _state_sentence(r)
    if sentence is not None:
        out.append(sentence + "\n\n")
    _push_block(out, r.stdout)
    if r.stderr:
        out.append("[stderr]\n")
        _push_block(out, r.stderr)
    for d in r.displays:
        if d.mime in IMAGE_MIMES:
            out.append(f"[display {d.display}: image {d.mime}, attached]\n")
        elif d.mime in ("text/plain", "text/markdown", "application/json"):
            _push_block(out, d.data)
        else:
            size = len(d.data.encode("utf-8"))
            out.append(f"[display {d.display}: {d.mime}, {size} bytes, in the structured result]\n")
    if r.truncated.displays_note is not None:
        out.append(f"({r.truncated.displays_note})\n")
    if r.value is not None:
        out.append(f"Out[{r.kernel.execution_count}]: {r.value}\n")
    if r.status is not Status.SUCCESS:
        if r.traceback is not None and r.traceback.strip():
            _push_block(out, _short_traceback(r.traceback))
        beyond = r.error_beyond_traceback()
        if beyond is not None:
            _push_block(out, beyond)
        if r.hint is not None:
            out.append(f"Hint: {r.hint}\n")
        out.append(_status_sentence(r) + "\n")
    if r.truncated.spill_path is not None:
        out.append(
            f"(output was cut; the full text is in {r.truncated.spill_path} inside the kernel)\n"
        )
    if r.tool_calls_made > 0:
        out.append(f"({r.tool_calls_made} tool call(s) made)\n")
    text = "".join(out)
    if not text.strip():
        text = "(no output)"
    return text.rstrip()


def render_in(r: CellResult, session: str | None) -> str:
    """`render`, first naming the session when the call named one."""
    if session is None:
        return render(r)
    return f"[session {_rust_debug_str(session)}]\n{render(r)}"


def _state_sentence(r: CellResult) -> str | None:
    k = r.kernel
    note = f" ({k.note})" if k.note is not None else ""
    if k.state_lost:
        return (
            f"The kernel's state was lost{note}: variables, imports and definitions from "
            "earlier calls are gone; re-run the setup you need."
        )
    if k.state_reset:
        return (
            f"The kernel was restarted before this cell{note}: earlier variables and imports "
            "are gone."
        )
    return f"Note: {k.note}" if k.note is not None else None


def _status_sentence(r: CellResult) -> str:
    if r.kernel.ended:
        ended = " The kernel ended; the next call starts a fresh one (state is gone)."
    elif r.kernel.state_lost:
        ended = ""
    else:
        ended = " The kernel's state is kept."
    if r.status is Status.TIMEOUT:
        return f"[timeout after {r.duration_seconds:.1f} s]{ended}"
    if r.status is Status.INTERRUPTED:
        return f"[interrupted]{ended}"
    if r.status is Status.ERROR:
        return f"[error]{ended}"
    return f"[{r.status.value}]{ended}"


def _short_traceback(tb: str) -> str:
    lines = _lines(tb)
    if len(lines) <= TRACEBACK_LINES:
        return tb
    skipped = len(lines) - TRACEBACK_LINES
    head = f"Traceback (most recent call last, {skipped} line(s) above cut):\n"
    return head + "\n".join(lines[skipped:])


def _push_block(out: list[str], text: str) -> None:
    if not text:
        return
    out.append(text)
    if not text.endswith("\n"):
        out.append("\n")


def _rust_debug_str(s: str) -> str:
    """`{:?}` of a Rust string, for the plain names sessions have."""
    escaped = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + escaped.replace("\r", "\\r").replace("\t", "\\t") + '"'
