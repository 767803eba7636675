"""HTTP/1.1 to the daemon with the standard library alone: kept-alive
connections in a small pool (one per thread in flight), JSON bodies,
the daemon's error shape mapped to exceptions, and server-sent events.

Why the standard library: the client has no dependencies to conflict with
an agent's own (pinned httpx, pydantic, …), installs anywhere Python runs,
and `http.client` on a kept-alive connection is as fast as it gets in
Python. A request is retried once on a fresh connection only when a
pooled connection turned out closed before the request was sent, so a
cell never runs twice."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any, Union

from .errors import APIError, DaemonUnreachable, for_status

DEFAULT_URL = "http://127.0.0.1:8787"
#: A pooled connection idle longer than this is not reused (the daemon
#: closes idle keep-alive connections after `[server] idle_timeout_seconds`).
IDLE_REUSE_SECONDS = 20.0

Body = Union[bytes, None]


class Response:
    """A response whose body is still to be read (streams, downloads)."""

    def __init__(
        self, transport: Transport, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse
    ) -> None:
        self._transport = transport
        self._conn: http.client.HTTPConnection | None = conn
        self.resp = resp
        self.status = resp.status

    def header(self, name: str) -> str | None:
        return self.resp.getheader(name)

    def read(self) -> bytes:
        try:
            return self.resp.read()
        finally:
            self.close()

    def lines(self) -> Iterator[bytes]:
        """The body line by line (for server-sent events)."""
        try:
            while True:
                line = self.resp.readline()
                if not line:
                    return
                yield line
        finally:
            self.close()

    def abort(self) -> None:
        """Drop the connection (a stream left part way is never reused)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.resp.isclosed() and not self.resp.will_close:
            self._transport._give_back(conn)
        else:
            conn.close()


class Transport:
    """The connections to one daemon."""

    def __init__(self, url: str, token: str | None, timeout: float | None) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(
                f"{url!r} is not a daemon URL; use http://HOST:PORT (e.g. {DEFAULT_URL})"
            )
        self.url = url.rstrip("/")
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = parsed.port or (443 if self._https else 80)
        self._prefix = parsed.path.rstrip("/")
        self._token = token
        self._timeout = timeout
        self._idle: list[tuple[float, http.client.HTTPConnection]] = []
        self._lock = threading.Lock()

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self._timeout)
        try:
            conn.connect()
        except OSError as e:
            raise DaemonUnreachable(self.url, str(e) or type(e).__name__) from None
        if conn.sock is not None:
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            while self._idle:
                since, conn = self._idle.pop()
                if time.monotonic() - since < IDLE_REUSE_SECONDS:
                    return conn, True
                conn.close()
        return self._connect(), False

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < 8:
                self._idle.append((time.monotonic(), conn))
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for _, conn in idle:
            conn.close()

    def _headers(self, content_type: str | None, accept: str) -> dict[str, str]:
        h = {"Accept": accept}
        if content_type is not None:
            h["Content-Type"] = content_type
        if self._token:
            h["Authorization"] = f"Bearer {self._token}"
        return h

    def send(
        self,
        method: str,
        path: str,
        body: Body = None,
        *,
        content_type: str | None = None,
        accept: str = "application/json",
    ) -> Response:
        """Send a request; the response's body is the caller's to read.
        Raises the daemon's error for a 4xx/5xx."""
        headers = self._headers(content_type, accept)
        target = self._prefix + path
        for attempt in (0, 1):
            conn, reused = self._take()
            try:
                conn.request(method, target, body=body, headers=headers)
            except OSError as e:
                conn.close()
                if reused and attempt == 0:
                    continue  # a pooled connection the daemon had closed: never sent
                raise DaemonUnreachable(self.url, str(e) or type(e).__name__) from None
            try:
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                if reused and attempt == 0 and isinstance(e, http.client.RemoteDisconnected):
                    # Closed under us with no byte of an answer: the daemon
                    # closes an idle connection before it reads a request.
                    continue
                raise DaemonUnreachable(self.url, f"the connection failed: {e}") from None
            r = Response(self, conn, resp)
            if r.status >= 400:
                raise _error(r)
            return r
        raise DaemonUnreachable(self.url, "the connection kept closing")

    def json(self, method: str, path: str, body: Any = None) -> Any:
        """A JSON request and its JSON answer."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        r = self.send(
            method, path, data, content_type="application/json" if data is not None else None
        )
        raw = r.read()
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise APIError(
                r.status, "bad_answer", "the answer is not JSON; is this a cellhost daemon?"
            ) from None


def _error(r: Response) -> APIError:
    raw = r.read()
    code, message = "http_error", raw.decode("utf-8", "replace")[:500] or f"HTTP {r.status}"
    try:
        e = json.loads(raw)["error"]
        code, message = str(e["code"]), str(e["message"])
    except (ValueError, KeyError, TypeError):
        pass
    return for_status(r.status, code, message)


def events(resp: Response) -> Iterator[tuple[str, str, str | None]]:
    """Server-sent events of a streaming response: (event, data, id)."""
    name, ident = "message", None
    data: list[str] = []
    for raw in resp.lines():
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield name, "\n".join(data), ident
            name, data, ident = "message", [], None
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "event":
            name = value
        elif key == "data":
            data.append(value)
        elif key == "id":
            ident = value
    if data:
        yield name, "\n".join(data), ident


def segment(s: str) -> str:
    """One URL path segment."""
    return urllib.parse.quote(s, safe="")


def file_path(path: str) -> str:
    """A workspace path in a URL (its slashes kept)."""
    return urllib.parse.quote(path.lstrip("/"), safe="/")
