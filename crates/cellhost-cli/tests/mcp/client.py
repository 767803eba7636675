"""Drives cellhost's MCP server with the official MCP Python SDK (PyPI `mcp`).

    python client.py stdio CELLHOST DATA_DIR
    python client.py http URL TOKEN
    python client.py codemode CELLHOST DATA_DIR CONFIG
    python client.py hygiene URL TOKEN  (a daemon with idle_session_seconds = 2)

Each scenario asserts what a real client sees and prints "OK <scenario>"
at the end; any failed assertion exits non-zero with the reason.
"""

import json
import logging
import os
import re
import sys
import time

import anyio
import httpx2
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client


def text(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def run(client, code, **kw):
    args = {"code": code}
    args.update(kw)
    return await client.call_tool("execute_code", args)


async def check_basics(s):
    listed = await s.list_tools()
    names = sorted(t.name for t in listed.tools)
    assert names == ["execute_code", "fork_session", "interrupt", "list_kernels", "reset_session"], names
    # The model is told its environment and dialect.
    desc = next(t for t in listed.tools if t.name == "execute_code").description
    assert re.search(r"Environment: Python 3\.\d+\.\d+", desc), desc
    assert "%pip install NAME" in desc and "!cmd" in desc and "%%bash" in desc, desc

    r = await run(s, "x = 41")
    assert not r.is_error, text(r)
    r = await run(s, "x + 1")
    assert "Out[2]: 42" in text(r), text(r)
    assert r.structured_content["value"] == "42", r.structured_content
    assert r.structured_content["kernel"]["reused"] is True, r.structured_content

    r = await run(s, "1/0")
    assert r.is_error and "ZeroDivisionError" in text(r), text(r)
    assert "state is kept" in text(r), text(r)

    # The dialect, and a hint in the text and the structured result.
    r = await run(s, "out = !echo dialect-ok\nout")
    assert "['dialect-ok']" in text(r), text(r)
    r = await run(s, "import no_such_module_cellhost_x")
    assert r.is_error, text(r)
    assert "Hint: install it with `%pip install no_such_module_cellhost_x`" in text(r), text(r)
    assert r.structured_content["hint"].startswith("install it with"), r.structured_content

    # An image display arrives as MCP image content.
    png = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
    r = await run(s, "display({'image/png': %r}, raw=True)" % png)
    images = [c for c in r.content if getattr(c, "type", "") == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png", r.content
    assert "image/png, attached" in text(r), text(r)

    # A timeout interrupts and keeps state.
    r = await run(s, "import time\ny = 5\ntime.sleep(30)", timeout=1)
    assert r.structured_content["status"] == "timeout", r.structured_content
    r = await run(s, "y")
    assert "Out" in text(r) and "5" in text(r), text(r)

    # Progress notifications carry output lines while the cell runs.
    seen = []

    async def progress(p, total, message):
        seen.append((time.monotonic(), message))

    start = time.monotonic()
    r = await s.call_tool(
        "execute_code",
        {"code": "import time\nfor i in range(3):\n    print('line', i)\n    time.sleep(0.4)"},
        progress_callback=progress,
    )
    end = time.monotonic()
    joined = "".join(m or "" for _, m in seen)
    assert "line 0" in joined and "line 2" in joined, seen
    assert seen[0][0] < end - 0.5, ("first progress came only at the end", seen, start, end)

    # Cancelling a call interrupts its cell; state survives.
    await run(s, "z = 7")
    t0 = time.monotonic()
    with anyio.move_on_after(1.0):
        await run(s, "import time\ntime.sleep(30)\nz = 0")
    r = await run(s, "z")
    assert "7" in text(r), text(r)
    assert time.monotonic() - t0 < 15, "the cancelled cell was not interrupted"

    # fork_session: a new session starts with a copy of this one's state,
    # and is its own from then on.
    await run(s, "fk = 41")
    tgt = "fork-" + os.urandom(4).hex()
    r = await s.call_tool("fork_session", {"into": [tgt]})
    assert not r.is_error and r.structured_content["into"][0]["session"] == tgt, r
    assert "Forked session" in text(r), text(r)
    r = await run(s, "fk += 1\nfk", session=tgt)
    assert "42" in text(r) and "fork of" in text(r), text(r)
    r = await run(s, "fk")
    assert "41" in text(r), text(r)
    r = await s.call_tool("fork_session", {"into": [tgt]})
    assert r.is_error and "dispose" in text(r), text(r)

    # interrupt with nothing running, list_kernels, reset_session.
    r = await s.call_tool("interrupt", {})
    assert "nothing to interrupt" in text(r), text(r)
    r = await s.call_tool("list_kernels", {})
    kernels = r.structured_content["kernels"]
    assert len(kernels) >= 1, r.structured_content
    r = await s.call_tool("reset_session", {})
    assert "Discarded" in text(r), text(r)
    r = await run(s, "x")
    assert r.is_error and "NameError" in text(r), text(r)

    # reset=True restarts before running and says so.
    await run(s, "w = 1")
    r = await run(s, "w", reset=True)
    assert "restarted" in text(r) and "NameError" in text(r), text(r)

    # Bad arguments are a tool error that says what was wrong.
    r = await s.call_tool("execute_code", {"cod": "1"})
    assert r.is_error and "cod" in text(r), text(r)
    r = await s.call_tool("execute_code", {"code": "1", "timeout": -1})
    assert r.is_error and "timeout" in text(r), text(r)


async def stdio(cellhost, data_dir):
    params = StdioServerParameters(
        command=cellhost, args=["mcp", "--sandbox", "none", "--data-dir", data_dir]
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            info = await s.initialize()
            assert info.server_info.name == "cellhost", info
            await check_basics(s)
            # A named session is a separate kernel.
            await run(s, "q = 'mine'")
            r = await run(s, "q", session="conv-1")
            assert "NameError" in text(r), text(r)
            await check_resources(s)


async def check_resources(s):
    """The session's workspace files are resources: text and blob."""
    import base64

    await run(
        s,
        "import os\nos.makedirs('out', exist_ok=True)\n"
        "open('out/notes.txt','w').write('héllo')\n"
        "open('chart.png','wb').write(bytes(range(256)))",
    )
    listed = await s.list_resources()
    uris = {str(r.uri): r for r in listed.resources}
    assert "cellhost://workspace/out/notes.txt" in uris, uris
    assert uris["cellhost://workspace/chart.png"].mime_type == "image/png", uris
    r = await s.read_resource("cellhost://workspace/out/notes.txt")
    assert r.contents[0].text == "héllo", r
    r = await s.read_resource("cellhost://workspace/chart.png")
    assert base64.b64decode(r.contents[0].blob) == bytes(range(256)), r
    try:
        await s.read_resource("cellhost://workspace/../etc/passwd")
        raise AssertionError("a path outside the workspace was read")
    except Exception as e:  # an MCP error, not the file
        assert "root:" not in str(e), e


def http_client(token):
    headers = {"Authorization": "Bearer " + token} if token else {}
    return httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0))


async def http(url, token):
    # Without the token: refused with a 401 (the SDK only says "error").
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "0"}}}
    async with http_client("") as c:
        resp = await c.post(url, json=init,
                            headers={"Accept": "application/json, text/event-stream"})
        assert resp.status_code == 401, (resp.status_code, resp.text)
    failed = False
    try:
        async with streamable_http_client(url, http_client=http_client("")) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
    except BaseException:  # the SDK raises its transport error (in a group)
        failed = True
    assert failed, "initialize without a token succeeded"

    async with streamable_http_client(url, http_client=http_client(token)) as (ra, wa):
        async with ClientSession(ra, wa) as a:
            await a.initialize()
            await check_basics(a)
            async with streamable_http_client(url, http_client=http_client(token)) as (rb, wb):
                async with ClientSession(rb, wb) as b:
                    await b.initialize()
                    # Two connections, two kernels: b cannot see a's state.
                    await run(a, "secret = 'a'")
                    r = await run(b, "secret")
                    assert r.is_error and "NameError" in text(r), text(r)
                    await run(b, "secret = 'b'")
                    r = await run(a, "secret")
                    assert "'a'" in text(r), text(r)
                    # ...unless both name the same session.
                    await run(a, "shared = 1", session="conv-7")
                    r = await run(b, "shared + 1", session="conv-7")
                    assert "Out" in text(r) and "2" in text(r), text(r)
                    owners = {k["owner"] for k in
                              (await a.call_tool("list_kernels", {})).structured_content["kernels"]}
                    assert "conv-7" in owners and len(owners) >= 3, owners
                    # The implicit owners are the MCP session ids (UUIDs).
                    ids = [o for o in owners if re.fullmatch(r"[0-9a-f-]{36}", o)]
                    assert len(ids) == 2, owners


async def codemode(cellhost, data_dir, config):
    params = StdioServerParameters(
        command=cellhost,
        args=["mcp", "--sandbox", "none", "--data-dir", data_dir, "--config", config],
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            listed = await s.list_tools()
            desc = next(t for t in listed.tools if t.name == "execute_code").description
            assert "tools.demo.add(*, a: integer, b: integer): Add two integers." in desc, desc
            assert "tools.demo.crash()" in desc, desc

            r = await run(s, "import tools\ntools.demo.add(a=2, b=3)")
            assert "Out[1]: 5" in text(r), text(r)
            assert r.structured_content["tool_calls_made"] == 1, r.structured_content
            # A loop in one cell: ten calls, one round trip for the model.
            r = await run(s, "sum(tools.demo.add(a=i, b=1) for i in range(10))")
            assert "Out[2]: 55" in text(r), text(r)
            r = await run(s, "tools.demo.shout(text='hi')")
            assert "'HI'" in text(r), text(r)
            r = await run(s, "tools.demo.fail(why='nope')")
            assert r.is_error and "ToolError" in text(r) and "nope" in text(r), text(r)
            # The per-cell budget (50) holds for downstream tools too.
            r = await run(s, "n = 0\nfor i in range(60):\n    tools.demo.add(a=1, b=1)\n    n += 1")
            assert r.is_error and "ToolError" in text(r), text(r)
            r = await run(s, "n")
            assert "50" in text(r), text(r)

            # A crashed server is restarted; meanwhile calls fail clearly.
            r = await run(s, "first = tools.demo.pid()\nfirst")
            first = r.structured_content["value"]
            r = await run(s, "tools.demo.crash()")
            assert r.is_error, text(r)
            r = await run(s, "tools.demo.pid()")
            assert r.is_error and ("not running" in text(r) or "restart" in text(r)), text(r)
            deadline = time.monotonic() + 20
            while True:
                r = await run(s, "tools.demo.pid()")
                if not r.is_error:
                    break
                assert time.monotonic() < deadline, "not restarted: " + text(r)
                await anyio.sleep(0.3)
            assert r.structured_content["value"] != first, (first, r.structured_content)
            r = await run(s, "tools.demo.add(a=20, b=22)")
            assert "42" in text(r), text(r)


class Captured(logging.Handler):
    """Every log record any logger (the SDK's included) emits."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


async def hygiene(url, token):
    captured = Captured()
    root = logging.getLogger()
    root.addHandler(captured)
    root.setLevel(logging.DEBUG)

    # A clean close (the SDK sends DELETE) logs no warning; a result of a
    # call that named a session says which.
    async with streamable_http_client(url, http_client=http_client(token)) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            res = await run(s, "6 * 7", session="conv-h")
            assert text(res).startswith('[session "conv-h"]\n'), text(res)
            assert "]: 42" in text(res), text(res)
            res = await run(s, "import os\nos.getpid()")
            assert "[session" not in text(res), text(res)
            closed_pid = int(res.structured_content["value"])
    # The capture sees the SDK's own records (so it would see the warning).
    assert any("StreamableHTTP" in m for m in captured.messages), captured.messages[:20]
    failed = [m for m in captured.messages if "Session termination failed" in m]
    assert not failed, failed
    # ...and its implicit kernel is disposed.
    deadline = time.monotonic() + 10
    while alive(closed_pid):
        assert time.monotonic() < deadline, "the closed session's kernel is still alive"
        await anyio.sleep(0.1)

    # An abandoned client (no DELETE) loses its kernel after the idle
    # period; a quiet cell longer than that in another session runs on.
    async with streamable_http_client(url, http_client=http_client(token)) as (rl, wl):
        async with ClientSession(rl, wl) as busy:
            await busy.initialize()
            await run(busy, "keep = 'kept'")
            async with streamable_http_client(
                url, http_client=http_client(token), terminate_on_close=False
            ) as (ra, wa):
                async with ClientSession(ra, wa) as gone:
                    await gone.initialize()
                    res = await run(gone, "import os\nos.getpid()")
                    pid = int(res.structured_content["value"])
            assert alive(pid), "the abandoned kernel went at once, not after the idle period"
            res = await run(busy, "import time\ntime.sleep(5)\nkeep", timeout=60)
            assert not res.is_error and "kept" in text(res), text(res)
            assert res.structured_content["kernel"]["reused"] is True, res.structured_content
            deadline = time.monotonic() + 10
            while alive(pid):
                assert time.monotonic() < deadline, "the abandoned client's kernel %d is still alive" % pid
                await anyio.sleep(0.1)
            # The busy session is still open, its state kept.
            res = await run(busy, "keep")
            assert not res.is_error and "kept" in text(res), text(res)
    failed = [m for m in captured.messages if "Session termination failed" in m]
    assert not failed, failed


def main():
    scenario = sys.argv[1]
    if scenario == "stdio":
        anyio.run(stdio, sys.argv[2], sys.argv[3])
    elif scenario == "http":
        anyio.run(http, sys.argv[2], sys.argv[3])
    elif scenario == "hygiene":
        anyio.run(hygiene, sys.argv[2], sys.argv[3])
    elif scenario == "codemode":
        anyio.run(codemode, sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        raise SystemExit("unknown scenario " + scenario)
    print("OK " + scenario)


if __name__ == "__main__":
    main()
