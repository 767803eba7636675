"""The cellhost Python client against a real daemon (started by
crates/cellhost-cli/tests/python_sdk.rs, which runs each scenario):

    python scenarios.py sync URL        every method of Client and Session
    python scenarios.py async URL       the same through cellhost.aio
    python scenarios.py render URL      .text() against the MCP server's text
    python scenarios.py tools URL       execute_code for the OpenAI / Anthropic SDKs
    python scenarios.py token URL TOKEN a daemon with a bearer token
    python scenarios.py nodaemon        nobody listening

Each prints "OK <scenario>" when every assertion held.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
import tempfile
import threading
import time

import cellhost
from cellhost import APIError, BadRequest, Client, Conflict, DaemonUnreachable, NotFound
from cellhost.aio import AsyncClient

PNG_CELL = (
    "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
    "plt.plot([1, 2, 3])\nplt.show()"
)


def unique(prefix: str) -> str:
    return f"{prefix}-{os.urandom(4).hex()}"


def sync(url: str) -> None:
    # The package under test is the installed wheel, not the source tree.
    assert "site-packages" in cellhost.__file__, cellhost.__file__
    with Client(url) as c:
        assert c.health()["status"] == "ok"
        s = c.session(unique("sync"))
        r = s.run("x = 41")
        assert r.ok and r.value is None and r.kernel.execution_count == 1, r
        r = s.run("x + 1")
        assert r.value == "42" and r.kernel.reused, r
        # An error is a result, not an exception.
        r = s.run("1/0")
        assert r.status is cellhost.Status.ERROR and "ZeroDivisionError" in (r.error or ""), r
        # Streaming: each callback gets its output before the result.
        seen: list[tuple[str, object]] = []
        r = s.run(
            "import sys, time\nprint('one', flush=True)\ntime.sleep(0.3)\n"
            "print('err', file=sys.stderr, flush=True)\nprint('two')",
            on_stdout=lambda t: seen.append(("out", t)),
            on_stderr=lambda t: seen.append(("err", t)),
        )
        assert r.ok and "".join(t for k, t in seen if k == "out") == "one\ntwo\n", seen
        assert ("err", "err\n") in seen and r.stderr == "err\n", (seen, r)
        # Displays: saved byte-exact (the PNG the kernel made).
        shown: list[list[cellhost.Display]] = []
        r = s.run(PNG_CELL, on_display=shown.append)
        assert r.ok and r.images, r
        png = r.images[0]
        assert png.image is not None and png.image.startswith(b"\x89PNG"), png.mime
        assert shown and shown[0][0].mime == png.mime, shown
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plot.png")
            assert png.save(path) == len(png.image)
            with open(path, "rb") as f:
                assert f.read() == base64.b64decode(png.data)
        # Reset, timeout, interrupt.
        r = s.run("x", reset=True)
        assert r.kernel.state_reset and "NameError" in (r.error or ""), r
        r = s.run("import time\ntime.sleep(5)", timeout=0.3)
        assert r.status is cellhost.Status.TIMEOUT, r
        assert s.interrupt() == 0
        runner = threading.Thread(target=lambda: seen.append(("r", s.run("time.sleep(30)"))))
        runner.start()
        deadline = time.monotonic() + 10
        while s.interrupt() == 0:
            assert time.monotonic() < deadline, "the running cell was never interrupted"
            time.sleep(0.05)
        runner.join(10)
        last = seen[-1][1]
        assert isinstance(last, cellhost.CellResult) and last.status.value == "interrupted"
        # Files.
        w = s.files.write("data/in.txt", b"hello\x00bytes")
        assert w["size"] == 11, w
        assert s.files.read("data/in.txt") == b"hello\x00bytes"
        r = s.run("open('data/in.txt', 'rb').read()")
        assert r.value == "b'hello\\x00bytes'", r
        names = [e["path"] for e in s.files.list(recursive=True)]
        assert "data/in.txt" in names, names
        assert [e["name"] for e in s.files.list("data")] == ["in.txt"]
        s.files.remove("data", recursive=True)
        try:
            s.files.read("data/in.txt")
            raise AssertionError("a removed file was read")
        except NotFound as e:
            assert e.code == "not_found", e
        # History, kernels, a child of its own.
        rows = s.history(limit=3)
        assert len(rows) == 3 and "time.sleep(30)" in [r["code"] for r in rows], rows
        assert len(s.kernels()) == 1 and s.kernels()[0]["owner"] == s.id
        child = s.child("worker")
        assert child.run("x = 'child'").ok and child.run("x").value == "'child'"
        assert s.run("'x' in globals()").value == "False", "the child's state is its own"
        # Fork and snapshot.
        s.run("k = {'v': 1}")
        target = unique("fork")
        report = s.fork(target)
        assert report.into[0].session == target and report.into[0].path == "process", report
        f = c.session(target).run("k['v'] += 1\nk")
        assert f.value == "{'v': 2}" and f.kernel.forked_from == s.id, f
        assert f.kernel.restored is not None and f.kernel.restored.from_ == "fork", f
        assert s.run("k").value == "{'v': 1}"
        try:
            s.fork(target)
            raise AssertionError("a fork into a session in use was made")
        except Conflict as e:
            assert e.code == "fork_target_in_use" and "dispose" in e.message, e
        try:
            snap = s.snapshot()
            assert snap.names >= 1, snap
        except Conflict as e:  # a daemon with snapshots off says so
            assert e.code == "snapshots_off", e
        # Errors: a bad request, an unknown session.
        try:
            s.run("1", timeout=-1)
            raise AssertionError("a negative timeout was taken")
        except BadRequest as e:
            assert "timeout" in e.message, e
        try:
            c.session(unique("nobody")).interrupt()
            raise AssertionError("an unknown session was interrupted")
        except NotFound as e:
            assert e.code == "unknown_session", e
        # Live attach: another client's cell shows up on the stream.
        watcher = c.session(s.id).events()
        got: list[cellhost.Event] = []

        def watch() -> None:
            for ev in watcher:
                got.append(ev)
                if ev.name == "cell_finished":
                    return

        t = threading.Thread(target=watch)
        t.start()
        time.sleep(0.3)
        with Client(url) as other:
            other.session(s.id).run("print('seen')")
        t.join(10)
        assert [e.name for e in got][-1:] == ["cell_finished"], got
        assert any(e.name == "stdout" and e.data.get("text") == "seen\n" for e in got), got
        assert s.dispose() >= 1
        r = s.run("'k' in globals()")
        assert r.value == "False" and r.kernel.state_reset, r
        assert s.dispose() >= 1
    print("OK sync")


async def async_(url: str) -> None:
    async with AsyncClient(url) as c:
        assert (await c.health())["status"] == "ok"
        a, b = c.session(unique("aio-a")), c.session(unique("aio-b"))
        # Two sessions' cells run at once, not one after the other: a's
        # cell waits for the file b's cell makes (no timing assumed).
        flag = os.path.join(tempfile.gettempdir(), unique("aio-flag"))
        wait_for_b = (
            f"import os, time\nfor _ in range(600):\n    if os.path.exists({flag!r}): break\n"
            "    time.sleep(0.05)\nelse:\n    raise RuntimeError('b never ran alongside')\nv = 'a'"
        )
        ra, rb = await asyncio.gather(
            a.run(wait_for_b),
            b.run(f"import time\ntime.sleep(0.2)\nopen({flag!r}, 'w').close()\nv = 'b'"),
        )
        os.unlink(flag)
        assert ra.ok and rb.ok, (ra, rb)
        assert (await a.run("v")).value == "'a'" and (await b.run("v")).value == "'b'"
        # Callbacks run on the loop's thread, before the result.
        loop_thread = threading.get_ident()
        seen: list[str] = []

        def on_out(text: str) -> None:
            assert threading.get_ident() == loop_thread
            seen.append(text)

        r = await a.run(
            "print('x', flush=True)\nimport time\ntime.sleep(0.2)\nprint('y')", on_stdout=on_out
        )
        assert "".join(seen) == "x\ny\n" and r.ok, (seen, r)
        await a.files.write("f.txt", "text")
        assert await a.files.read("f.txt") == b"text"
        assert [e["name"] for e in await a.files.list()] == ["f.txt"]
        await a.files.remove("f.txt")
        assert await a.interrupt() == 0
        assert len(await a.history(10)) >= 3
        assert len(await a.kernels()) == 1
        snap = await a.snapshot()
        assert snap.names >= 1 and snap.bytes > 0, snap
        target = unique("aio-fork")
        fork = await a.fork([target])
        assert fork.into[0].session == target
        assert (await c.session(target).run("v")).value == "'a'"
        child = a.child("w")
        assert (await child.run("1 + 1")).value == "2"
        try:
            await a.run("1", timeout=0)
            raise AssertionError("a zero timeout was taken")
        except BadRequest:
            pass
        events = a.events()
        reader = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(0.3)
        await a.run("print('watched')")
        first = await asyncio.wait_for(reader, 10)
        assert first.name == "cell_started", first
        await events.aclose()
        for s in (a, b, c.session(target)):
            await s.dispose()
    print("OK async")


RENDER_CELLS = [
    "print('hello')\n41 + 1",
    "1/0",
    "import sys\nprint('to err', file=sys.stderr)\n'v'",
    "def f(n):\n    return f(n + 1) if n < 30 else 1/0\nf(0)",
    "import time\ntime.sleep(5)",
    "print('y' * 200_000)",
    PNG_CELL,
    "class H:\n    def _repr_html_(self):\n        return '<b>hi</b>'\nH()",
    "raise SystemExit(3)",
    "x = 1",
]


async def render(url: str) -> None:
    """Each cell through MCP's execute_code: its text content must be what
    CellResult.text() makes of its structured content (the cell result)."""
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with streamable_http_client(url.rstrip("/") + "/mcp") as (read, write, *_):
        async with ClientSession(read, write) as mcp:
            await mcp.initialize()
            for i, code in enumerate(RENDER_CELLS):
                args: dict[str, object] = {"code": code}
                if "sleep(5)" in code:
                    args["timeout"] = 0.5
                out = await mcp.call_tool("execute_code", args)
                texts = [b.text for b in out.content if getattr(b, "type", "") == "text"]
                assert out.structured_content is not None, out
                mine = cellhost.CellResult.from_json(dict(out.structured_content)).text()
                assert texts == [mine], f"cell {i} ({code[:30]!r}):\nMCP:\n{texts}\nSDK:\n{mine}"
    print("OK render")


def tools(url: str) -> None:
    """The tool shapes, checked against the official SDKs' own types."""
    import anthropic.types as at
    import openai.types.chat as oc
    import openai.types.responses as orr
    import openai.types.responses.response_input_param as rip
    from pydantic import TypeAdapter

    from cellhost.tools import ExecuteCode

    def valid(kind: object, value: object) -> None:
        TypeAdapter(kind).validate_python(value)

    with Client(url) as c:
        tool = ExecuteCode(c, unique("agent"))
        valid(at.ToolParam, tool.anthropic())
        valid(oc.ChatCompletionFunctionToolParam, tool.openai_chat())
        valid(orr.FunctionToolParam, tool.openai_responses())
        block = tool.anthropic_result("toolu_1", {"code": "x = 20\nx * 2"})
        valid(at.ToolResultBlockParam, block)
        assert block["content"][0]["text"] == "Out[1]: 40" and not block["is_error"], block
        msgs = tool.openai_chat_result("call_1", '{"code": "x + 2"}')
        for m in msgs:
            valid(oc.ChatCompletionToolMessageParam, m)
        assert msgs == [{"role": "tool", "tool_call_id": "call_1", "content": "Out[2]: 22"}], msgs
        items = tool.openai_responses_result("call_2", {"code": PNG_CELL})
        valid(rip.FunctionCallOutput, items[0])
        out = items[0]["output"]
        assert out[1]["type"] == "input_image" and out[1]["image_url"].startswith(
            "data:image/png;base64,"
        ), out
        with_image = tool.openai_chat_result("call_3", {"code": PNG_CELL})
        valid(oc.ChatCompletionToolMessageParam, with_image[0])
        valid(oc.ChatCompletionUserMessageParam, with_image[1])
        block = tool.anthropic_result("toolu_2", {"code": PNG_CELL})
        valid(at.ToolResultBlockParam, block)
        assert block["content"][1]["type"] == "image", block
        # A model's bad call is answered in words, never an exception.
        bad = tool.anthropic_result("toolu_3", '{"cod": 1}')
        assert bad["is_error"] and "takes" in bad["content"][0]["text"], bad
        bad = tool.anthropic_result("toolu_4", "{not json")
        assert bad["is_error"] and "not JSON" in bad["content"][0]["text"], bad
        err = tool.anthropic_result("toolu_5", {"code": "1/0"})
        assert err["is_error"] and "ZeroDivisionError" in err["content"][0]["text"], err
        tool.session.dispose()
    print("OK tools")


def token(url: str, secret: str) -> None:
    os.environ.pop("CELLHOST_TOKEN", None)
    try:
        Client(url).session("t").run("1")
        raise AssertionError("a tokenless call was answered")
    except cellhost.Unauthorized as e:
        assert e.status == 401, e
    try:
        Client(url, "wrong").session("t").run("1")
        raise AssertionError("a wrong token was taken")
    except cellhost.Unauthorized:
        pass
    assert Client(url, secret).session("t").run("2 + 2").value == "4"
    os.environ["CELLHOST_TOKEN"] = secret
    os.environ["CELLHOST_URL"] = url
    assert Client().session("t").run("3 + 3").value == "6", "defaults from the environment"
    print("OK token")


def nodaemon() -> None:
    try:
        Client("http://127.0.0.1:9").session("s").run("1")
        raise AssertionError("nobody answered, yet a result came")
    except DaemonUnreachable as e:
        assert "cellhost serve" in str(e) and "127.0.0.1:9" in str(e), e
    try:
        Client("ftp://x")
        raise AssertionError("a bad URL was taken")
    except ValueError as e:
        assert "http://" in str(e), e
    assert issubclass(DaemonUnreachable, cellhost.CellhostError)
    assert issubclass(Conflict, APIError)
    print("OK nodaemon")


def main() -> None:
    which, rest = sys.argv[1], sys.argv[2:]
    if which == "sync":
        sync(rest[0])
    elif which == "async":
        asyncio.run(async_(rest[0]))
    elif which == "render":
        asyncio.run(render(rest[0]))
    elif which == "tools":
        tools(rest[0])
    elif which == "token":
        token(rest[0], rest[1])
    elif which == "nodaemon":
        nodaemon()
    else:
        raise SystemExit(f"unknown scenario {which}")


if __name__ == "__main__":
    main()
