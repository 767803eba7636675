"""The asyncio client: the same API as `cellhost.Client`, awaitable.

Each call runs the synchronous client's on a worker thread (its pool keeps
one kept-alive connection per call in flight, so concurrent calls run
concurrently), and streaming callbacks are called on the event loop's
thread, in order, before the call's result is delivered."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import IO, Any, Callable, TypeVar

from .client import Client, Event, OnDisplay, OnText, Session
from .results import CellResult, ForkReport, Json, SnapshotReport

T = TypeVar("T")


async def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))


def _on_loop(
    loop: asyncio.AbstractEventLoop, cb: Callable[[Any], None] | None
) -> Callable[[Any], None] | None:
    if cb is None:
        return None

    def forward(value: Any) -> None:
        loop.call_soon_threadsafe(cb, value)

    return forward


class AsyncClient:
    """One cellhost daemon, for asyncio code (see `cellhost.Client`)."""

    def __init__(
        self, url: str | None = None, token: str | None = None, *, timeout: float | None = None
    ) -> None:
        self.sync = Client(url, token, timeout=timeout)

    @property
    def url(self) -> str:
        return self.sync.url

    def session(self, session: str) -> AsyncSession:
        return AsyncSession(self.sync.session(session))

    async def kernels(self) -> list[Json]:
        return await _call(self.sync.kernels)

    async def environment(self) -> Json:
        return await _call(self.sync.environment)

    async def health(self) -> Json:
        return await _call(self.sync.health)

    async def close(self) -> None:
        self.sync.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncSession:
    """A session, for asyncio code (see `cellhost.Session`)."""

    def __init__(self, sync: Session) -> None:
        self.sync = sync
        self.files = AsyncFiles(sync)

    @property
    def id(self) -> str:
        return self.sync.id

    def child(self, child: str) -> AsyncSession:
        return AsyncSession(self.sync.child(child))

    async def run(
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
        loop = asyncio.get_running_loop()
        return await _call(
            self.sync.run,
            code,
            timeout=timeout,
            reset=reset,
            tools=tools,
            max_tool_calls=max_tool_calls,
            on_stdout=_on_loop(loop, on_stdout),
            on_stderr=_on_loop(loop, on_stderr),
            on_display=_on_loop(loop, on_display),
        )

    async def interrupt(self) -> int:
        return await _call(self.sync.interrupt)

    async def dispose(self) -> int:
        return await _call(self.sync.dispose)

    async def history(self, limit: int = 100) -> list[Json]:
        return await _call(self.sync.history, limit)

    async def kernels(self) -> list[Json]:
        return await _call(self.sync.kernels)

    async def snapshot(self) -> SnapshotReport:
        return await _call(self.sync.snapshot)

    async def fork(self, into: str | list[str]) -> ForkReport:
        return await _call(self.sync.fork, into)

    async def events(self, since: int | None = None) -> AsyncIterator[Event]:
        """The live stream; each event is read on a worker thread."""
        it = self.sync.events(since)  # a generator: closed below
        done = object()
        try:
            while True:
                ev = await _call(next, it, done)
                if ev is done:
                    return
                assert isinstance(ev, Event)
                yield ev
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                await _call(close)


class AsyncFiles:
    """The session's workspace, for asyncio code."""

    def __init__(self, session: Session) -> None:
        self._f = session.files

    async def write(self, path: str, data: bytes | str | IO[bytes]) -> Json:
        return await _call(self._f.write, path, data)

    async def read(self, path: str) -> bytes:
        return await _call(self._f.read, path)

    async def list(self, path: str = "", *, recursive: bool = False) -> list[Json]:
        return await _call(self._f.list, path, recursive=recursive)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await _call(self._f.remove, path, recursive=recursive)
