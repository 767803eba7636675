"""Typed mirrors of the daemon's wire types: the cell result contract
(docs/result.md) and what the snapshot and fork routes answer.

Every type keeps the JSON it was made from as `raw`, so a field a newer
daemon adds is never lost."""

from __future__ import annotations

import base64
import enum
import os
from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]


class Status(str, enum.Enum):
    """How a cell ended. A status a newer daemon adds is kept by its wire name."""

    SUCCESS = "success"
    ERROR = "error"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"

    @classmethod
    def _missing_(cls, value: object) -> Status:
        member = str.__new__(cls, str(value))
        member._name_ = str(value).upper()
        member._value_ = str(value)
        return member


def is_text_mime(mime: str) -> bool:
    """Whether a display's `data` travels as text (else base64), as the daemon decides."""
    return (
        mime.startswith("text/")
        or mime.endswith("+xml")
        or mime.endswith("json")
        or mime == "application/javascript"
    )


@dataclass(frozen=True)
class Display:
    """One item of a rich display (a bundle's items share `display`)."""

    mime: str
    data: str
    display: int

    @property
    def is_base64(self) -> bool:
        return not is_text_mime(self.mime)

    @property
    def content(self) -> bytes:
        """The item's bytes: base64 decoded, or the text as UTF-8."""
        if self.is_base64:
            return base64.b64decode(self.data)
        return self.data.encode("utf-8")

    @property
    def image(self) -> bytes | None:
        """The image's bytes, for an `image/*` item; else None."""
        return self.content if self.mime.startswith("image/") else None

    def save(self, path: str | os.PathLike[str]) -> int:
        """Write the item's bytes to `path`; returns how many."""
        data = self.content
        with open(path, "wb") as f:
            f.write(data)
        return len(data)

    @classmethod
    def from_json(cls, j: Json) -> Display:
        return cls(
            mime=str(j.get("mime", "")),
            data=str(j.get("data", "")),
            display=int(j.get("display", 0)),
        )


@dataclass(frozen=True)
class Truncated:
    """What was cut from the result, and where the whole text went."""

    stdout: bool = False
    stderr: bool = False
    spill_path: str | None = None
    displays_dropped: int = 0
    displays_note: str | None = None

    @classmethod
    def from_json(cls, j: Json) -> Truncated:
        return cls(
            stdout=bool(j.get("stdout", False)),
            stderr=bool(j.get("stderr", False)),
            spill_path=j.get("spill_path"),
            displays_dropped=int(j.get("displays_dropped", 0)),
            displays_note=j.get("displays_note"),
        )


@dataclass(frozen=True)
class Skipped:
    """A global a snapshot could not keep: its name, type and why."""

    name: str
    type: str
    why: str

    @classmethod
    def from_json(cls, j: Json) -> Skipped:
        return cls(
            name=str(j.get("name", "")), type=str(j.get("type", "")), why=str(j.get("why", ""))
        )


@dataclass(frozen=True)
class Restored:
    """A snapshot was loaded into this fresh kernel before the cell ran."""

    names: int
    skipped: list[Skipped]
    from_: str
    age_seconds: int

    @classmethod
    def from_json(cls, j: Json) -> Restored:
        return cls(
            names=int(j.get("names", 0)),
            skipped=[Skipped.from_json(s) for s in j.get("skipped", [])],
            from_=str(j.get("from", "")),
            age_seconds=int(j.get("age_seconds", 0)),
        )


@dataclass(frozen=True)
class KernelInfo:
    """What happened to the kernel's state: `state_lost`, `state_reset`,
    `ended`, and a `note` in words whenever one of them is set."""

    id: str = ""
    backend: str = "local"
    pid: int | None = None
    reused: bool = False
    execution_count: int = 0
    state_reset: bool = False
    state_lost: bool = False
    ended: bool = False
    note: str | None = None
    restored: Restored | None = None
    forked_from: str | None = None

    @classmethod
    def from_json(cls, j: Json) -> KernelInfo:
        restored = j.get("restored")
        return cls(
            id=str(j.get("id", "")),
            backend=str(j.get("backend", "local")),
            pid=j.get("pid"),
            reused=bool(j.get("reused", False)),
            execution_count=int(j.get("execution_count", 0)),
            state_reset=bool(j.get("state_reset", False)),
            state_lost=bool(j.get("state_lost", False)),
            ended=bool(j.get("ended", False)),
            note=j.get("note"),
            restored=Restored.from_json(restored) if isinstance(restored, dict) else None,
            forked_from=j.get("forked_from"),
        )


@dataclass(frozen=True)
class CellResult:
    """One cell's result: the daemon's contract (docs/result.md)."""

    status: Status
    stdout: str
    stderr: str
    value: str | None
    error: str | None
    traceback: str | None
    hint: str | None
    displays: list[Display]
    value_display: int | None
    truncated: Truncated
    tool_calls_made: int
    duration_seconds: float
    kernel: KernelInfo
    raw: Json = field(repr=False, compare=False, default_factory=dict)

    @property
    def ok(self) -> bool:
        """The cell succeeded."""
        return self.status is Status.SUCCESS

    @property
    def images(self) -> list[Display]:
        """The image items of the displays, in order."""
        return [d for d in self.displays if d.mime.startswith("image/")]

    def error_beyond_traceback(self) -> str | None:
        """The error line, unless the traceback already ends with it."""
        if self.error is None:
            return None
        last = None
        if self.traceback is not None:
            lines = [ln for ln in _lines(self.traceback) if ln.strip()]
            last = lines[-1].strip() if lines else None
        return None if last == self.error.strip() else self.error

    def text(self) -> str:
        """The result as a model reads it: the same text the MCP server's
        `execute_code` returns (see `cellhost.render`)."""
        from .render import render

        return render(self)

    @classmethod
    def from_json(cls, j: Json) -> CellResult:
        return cls(
            status=Status(j.get("status", "error")),
            stdout=str(j.get("stdout", "")),
            stderr=str(j.get("stderr", "")),
            value=j.get("value"),
            error=j.get("error"),
            traceback=j.get("traceback"),
            hint=j.get("hint"),
            displays=[Display.from_json(d) for d in j.get("displays", [])],
            value_display=j.get("value_display"),
            truncated=Truncated.from_json(j.get("truncated") or {}),
            tool_calls_made=int(j.get("tool_calls_made", 0)),
            duration_seconds=float(j.get("duration_seconds", 0.0)),
            kernel=KernelInfo.from_json(j.get("kernel") or {}),
            raw=j,
        )


@dataclass(frozen=True)
class SnapshotReport:
    """What `Session.snapshot()` kept and skipped."""

    names: int
    skipped: list[Skipped]
    bytes: int
    seconds: float

    @classmethod
    def from_json(cls, j: Json) -> SnapshotReport:
        return cls(
            names=int(j.get("names", 0)),
            skipped=[Skipped.from_json(s) for s in j.get("skipped", [])],
            bytes=int(j.get("bytes", 0)),
            seconds=float(j.get("seconds", 0.0)),
        )


@dataclass(frozen=True)
class Forked:
    """One new session a fork made, and which path made it."""

    session: str
    child: str | None
    path: str
    fallback_reason: str | None
    workspace_bytes: int
    seconds: float

    @classmethod
    def from_json(cls, j: Json) -> Forked:
        return cls(
            session=str(j.get("session", "")),
            child=j.get("child"),
            path=str(j.get("path", "")),
            fallback_reason=j.get("fallback_reason"),
            workspace_bytes=int(j.get("workspace_bytes", 0)),
            seconds=float(j.get("seconds", 0.0)),
        )


@dataclass(frozen=True)
class ForkReport:
    """What `Session.fork()` made."""

    from_: str
    into: list[Forked]

    @classmethod
    def from_json(cls, j: Json) -> ForkReport:
        return cls(
            from_=str(j.get("from", "")), into=[Forked.from_json(f) for f in j.get("into", [])]
        )


def _lines(text: str) -> list[str]:
    """Lines as Rust's `str::lines` makes them (the MCP server's rendering
    is Rust): split at `\\n`, one trailing `\\r` dropped per line, no last
    empty line for a trailing newline."""
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    return [p[:-1] if p.endswith("\r") else p for p in parts]
