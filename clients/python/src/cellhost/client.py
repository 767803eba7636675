"""The synchronous client: `Client` (one daemon) and `Session` (one
conversation's kernel, or a delegated child's)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, Callable

from . import _http
from .errors import APIError
from .results import CellResult, Display, ForkReport, Json, SnapshotReport

#: A callback for streamed text (`on_stdout`, `on_stderr`).
OnText = Callable[[str], None]
#: A callback for one streamed display (its items: the bundle of mimes).
OnDisplay = Callable[[list[Display]], None]


@dataclass(frozen=True)
class Event:
    """One event of a session's live stream (docs/events.md)."""

    name: str
    data: Json
    id: int | None


class Client:
    """One cellhost daemon. `url` and `token` default to `CELLHOST_URL`
    (else http://127.0.0.1:8787) and `CELLHOST_TOKEN`, as the CLI's do.

    >>> with Client() as c:                       # doctest: +SKIP
    ...     s = c.session("conversation-1")
    ...     s.run("x = 41")
    ...     print(s.run("x + 1").value)
    42
    """

    def __init__(
        self, url: str | None = None, token: str | None = None, *, timeout: float | None = None
    ) -> None:
        url = url or os.environ.get("CELLHOST_URL") or _http.DEFAULT_URL
        token = token if token is not None else os.environ.get("CELLHOST_TOKEN")
        self._t = _http.Transport(url, token, timeout)

    @property
    def url(self) -> str:
        return self._t.url

    def session(self, session: str) -> Session:
        """The session `session` (created on its first cell)."""
        if not session:
            raise ValueError("a session id is a non-empty string, e.g. the conversation's id")
        return Session(self, session, None)

    def kernels(self) -> list[Json]:
        """Every live kernel the caller may see (`GET /v1/kernels`)."""
        return list(self._t.json("GET", "/v1/kernels") or [])

    def environment(self) -> Json:
        """What a new session's kernel runs in (`GET /v1/environment`)."""
        return dict(self._t.json("GET", "/v1/environment") or {})

    def health(self) -> Json:
        """`GET /healthz`: `{"status": "ok", "kernels": n}`."""
        return dict(self._t.json("GET", "/healthz") or {})

    def close(self) -> None:
        """Close the kept-alive connections."""
        self._t.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session:
    """A conversation's kernel on the daemon: its state persists from
    `run` to `run`; or a delegated child's (`session.child("worker")`),
    whose kernel and files are its own."""

    def __init__(self, client: Client, session: str, child: str | None) -> None:
        self.client = client
        self.id = session
        self.child_id = child
        self.files = Files(self)

    def __repr__(self) -> str:
        who = self.id if self.child_id is None else f"{self.id} child {self.child_id}"
        return f"<cellhost.Session {who}>"

    def child(self, child: str) -> Session:
        """The delegated child `child` of this session (never shares state with it)."""
        if self.child_id is not None:
            raise ValueError("a child has no children of its own here; name them from the session")
        if not child or "::" in child:
            raise ValueError("a child id is a non-empty string without '::'")
        return Session(self.client, self.id, child)

    @property
    def _base(self) -> str:
        base = f"/v1/sessions/{_http.segment(self.id)}"
        if self.child_id is not None:
            base += f"/children/{_http.segment(self.child_id)}"
        return base

    @property
    def _owner(self) -> str:
        return self.id if self.child_id is None else f"{self.id}::child::{self.child_id}"

    def request_body(
        self,
        code: str,
        *,
        timeout: float | None = None,
        reset: bool = False,
        tools: list[str] | None = None,
        max_tool_calls: int | None = None,
    ) -> Json:
        """The execute body `run` sends."""
        body: Json = {"code": code}
        if timeout is not None:
            body["timeout"] = timeout
        if reset:
            body["reset"] = True
        if self.child_id is not None:
            body["child"] = self.child_id
        if tools is not None:
            body["tools"] = list(tools)
        if max_tool_calls is not None:
            body["max_tool_calls"] = max_tool_calls
        return body

    def run(
        self,
        code: str,
        *,
        timeout: float | None = None,
        reset: bool = False,
        tools: list[str] | None = None,
        max_tool_calls: int | None = None,
        on_stdout: OnText | None = None,
        on_stderr: OnText | None = None,
        on_display: OnDisplay | None = None,
    ) -> CellResult:
        """Run `code` in this session's kernel. With a callback the output
        streams (server-sent events) and each callback gets it as it is
        made, before this returns the result."""
        body = self.request_body(
            code, timeout=timeout, reset=reset, tools=tools, max_tool_calls=max_tool_calls
        )
        path = f"/v1/sessions/{_http.segment(self.id)}/execute"
        if on_stdout is None and on_stderr is None and on_display is None:
            return CellResult.from_json(self.client._t.json("POST", path, body))
        data = json.dumps(body).encode("utf-8")
        resp = self.client._t.send(
            "POST", path, data, content_type="application/json", accept="text/event-stream"
        )
        result: CellResult | None = None
        failed: APIError | None = None
        try:
            # Read to the stream's end (it ends after `result`), so the
            # connection goes back to the pool.
            for name, text, _ in _http.events(resp):
                payload = json.loads(text)
                if name == "stdout" and on_stdout is not None:
                    on_stdout(payload.get("text", ""))
                elif name == "stderr" and on_stderr is not None:
                    on_stderr(payload.get("text", ""))
                elif name == "display" and on_display is not None:
                    on_display([Display.from_json(i) for i in payload.get("items", [])])
                elif name == "result":
                    result = CellResult.from_json(payload)
                elif name == "error":
                    e = payload.get("error", {})
                    failed = APIError(
                        resp.status, str(e.get("code", "error")), str(e.get("message", text))
                    )
        except BaseException:
            resp.abort()
            raise
        if failed is not None:
            raise failed
        if result is None:
            raise APIError(
                resp.status, "stream_ended", "the daemon's stream ended before the cell's result"
            )
        return result

    def interrupt(self) -> int:
        """Interrupt the running cell (KeyboardInterrupt; state kept).
        Returns how many cells were interrupted (0: none was running)."""
        path = f"/v1/sessions/{_http.segment(self.id)}/interrupt"
        return int(self.client._t.json("POST", path)["count"])

    def dispose(self) -> int:
        """Kill this session's kernels (and its children's) and drop its
        files; the next `run` starts fresh and says so. History is kept."""
        try:
            return int(self.client._t.json("DELETE", self._base)["count"])
        except APIError as e:
            if e.status == 404:
                return 0
            raise

    def history(self, limit: int = 100) -> list[Json]:
        """The session's last `limit` recorded cells, oldest first."""
        path = f"/v1/sessions/{_http.segment(self.id)}/history?limit={int(limit)}"
        return list(self.client._t.json("GET", path) or [])

    def kernels(self) -> list[Json]:
        """This session's live kernels."""
        return [k for k in self.client.kernels() if k.get("owner") == self._owner]

    def snapshot(self) -> SnapshotReport:
        """Snapshot the live kernel's state now, between cells (docs/snapshots.md)."""
        return SnapshotReport.from_json(self.client._t.json("POST", self._base + "/snapshot"))

    def fork(self, into: str | list[str]) -> ForkReport:
        """New sessions that start with a copy of this one's live state and
        files, independent from then on. Returns what was made."""
        targets = [into] if isinstance(into, str) else list(into)
        report = self.client._t.json("POST", self._base + "/fork", {"into": targets})
        return ForkReport.from_json(report)

    def events(self, since: int | None = None) -> Iterator[Event]:
        """The session's live stream: its cells from every front end as
        they run, and its kernel's changes (blocks; break to stop)."""
        path = self._base + "/events" + (f"?since={int(since)}" if since is not None else "")
        resp = self.client._t.send("GET", path, accept="text/event-stream")
        try:
            for name, text, ident in _http.events(resp):
                try:
                    data = json.loads(text)
                except ValueError:
                    data = {"text": text}
                yield Event(
                    name,
                    data if isinstance(data, dict) else {"value": data},
                    int(ident) if ident and ident.isdigit() else None,
                )
        finally:
            resp.abort()


class Files:
    """The session's workspace: the kernel's working directory."""

    def __init__(self, session: Session) -> None:
        self._s = session

    def _path(self, path: str) -> str:
        return self._s._base + "/files/" + _http.file_path(path)

    def write(self, path: str, data: bytes | str | IO[bytes]) -> Json:
        """Write a file (parents made); `{"path", "size", "sha256"}`."""
        if isinstance(data, str):
            body = data.encode("utf-8")
        elif isinstance(data, bytes):
            body = data
        else:
            body = data.read()
        resp = self._s.client._t.send(
            "PUT", self._path(path), body, content_type="application/octet-stream"
        )
        return dict(json.loads(resp.read()))

    def read(self, path: str) -> bytes:
        """A file's bytes."""
        return self._s.client._t.send("GET", self._path(path), accept="*/*").read()

    def list(self, path: str = "", *, recursive: bool = False) -> list[Json]:
        """The entries under `path` (`name`, `path`, `type`, `size`, `modified`)."""
        url = self._s._base + "/files"
        if path:
            url += "/" + _http.file_path(path).rstrip("/") + "/"
        if recursive:
            url += "?recursive=true"
        answer: Any = self._s.client._t.json("GET", url)
        return list(answer.get("entries", []))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, or a directory (with everything in it when `recursive`)."""
        url = self._path(path) + ("?recursive=true" if recursive else "")
        self._s.client._t.send("DELETE", url).read()
