"""Tenants against a real daemon (see tests/tenants.rs for its config).

    python scenario.py http URL      (stdlib only)
    python scenario.py jupyter URL   (needs websocket-client: the Jupyter venv)
    python scenario.py mcp URL       (needs the MCP Python SDK: the test venv)

Tokens: admin-token (the admin), alice-token, bob-token (by token_sha256),
capped-token (max_kernels = 2, max_sessions = 1), slow-token
(max_cells_per_minute = 3). Each scenario prints "OK <scenario>" when all
its assertions held.
"""

import json
import sys
import urllib.error
import urllib.request
import uuid

URL = sys.argv[2]
ADMIN, ALICE, BOB = "admin-token", "alice-token", "bob-token"


def http(method, path, body=None, token=ALICE, headers=None, raw=False):
    data = None
    h = {"Authorization": "Bearer " + token} if token else {}
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        if not isinstance(body, bytes):
            h["Content-Type"] = "application/json"
    h.update(headers or {})
    req = urllib.request.Request(URL + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, text, hdrs = r.status, r.read().decode(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        status, text, hdrs = e.code, e.read().decode(), {k.lower(): v for k, v in e.headers.items()}
    if raw:
        return status, text, hdrs
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text


def run(session, code, token=ALICE, **kw):
    kw["code"] = code
    s, r = http("POST", f"/v1/sessions/{session}/execute", kw, token)
    assert s == 200, (session, s, r)
    assert r["status"] == "success", r
    return r


def value(session, code, token=ALICE, **kw):
    return run(session, code, token, **kw)["value"]


def same_as_missing(method, path_of, token, mine, missing, body=None):
    """`mine` (another tenant's session) answers exactly as `missing`
    (a session nobody has), the name aside: same status, same body."""
    a = http(method, path_of(mine), body, token, raw=True)
    b = http(method, path_of(missing), body, token, raw=True)
    assert a[0] == b[0], (method, path_of(mine), a, b)
    assert a[1].replace(mine, missing) == b[1], (method, path_of(mine), a[1], b[1])
    return a[0]


def check_http():
    # Three same-named sessions: alice's, bob's and the admin's own.
    for who, token in [("alice", ALICE), ("bob", BOB), ("admin", ADMIN)]:
        run("s1", f"x = {who!r}\nopen('/workspace/mine.txt', 'w').write({who!r})", token)
    for who, token in [("alice", ALICE), ("bob", BOB), ("admin", ADMIN)]:
        assert value("s1", "x", token) == repr(who), who
    # The admin names a tenant's session tenant:session.
    assert value("alice:s1", "x", ADMIN) == "'alice'"
    assert value("bob:s1", "x", ADMIN) == "'bob'"
    # Distinct workspaces and uids (strict sandbox: one uid per workspace).
    ids = {}
    for who, token in [("alice", ALICE), ("bob", BOB), ("admin", ADMIN)]:
        ids[who] = value("s1", "import os\n(os.getuid(), open('/workspace/mine.txt').read())", token)
    uids = {v.split(",")[0] for v in ids.values()}
    assert len(uids) == 3, ids
    assert all(repr(w) in v for w, v in ids.items()), ids
    s, body, _ = http("GET", "/v1/sessions/s1/files/mine.txt", token=BOB, raw=True)
    assert (s, body) == (200, "bob"), (s, body)
    s, body, _ = http("GET", "/v1/sessions/s1/files/mine.txt", token=ALICE, raw=True)
    assert (s, body) == (200, "alice"), (s, body)

    # SSE execute runs in the caller's session too.
    s, text, _ = http("POST", "/v1/sessions/s1/execute", {"code": "print(x)"}, ALICE,
                      headers={"Accept": "text/event-stream"}, raw=True)
    assert s == 200 and "event: stdout" in text and "alice" in text and "bob" not in text, text

    # Alice's own session "a-only": bob (and the admin's plain name) see
    # nothing, and every route answers as for a session nobody has.
    run("a-only", "secret = 42")
    http("PUT", "/v1/sessions/a-only/files/f.txt", b"alice's", ALICE)
    routes = [
        ("POST", lambda s: f"/v1/sessions/{s}/interrupt", None),
        ("GET", lambda s: f"/v1/sessions/{s}/history", None),
        ("GET", lambda s: f"/v1/sessions/{s}/files", None),
        ("GET", lambda s: f"/v1/sessions/{s}/files/f.txt", None),
        ("DELETE", lambda s: f"/v1/sessions/{s}/files/f.txt", None),
        ("DELETE", lambda s: f"/v1/sessions/{s}/children/c", None),
        ("DELETE", lambda s: f"/v1/sessions/{s}", None),
        ("GET", lambda s: f"/api/kernels/{s}", None),
        ("POST", lambda s: f"/api/kernels/{s}/interrupt", None),
        ("POST", lambda s: f"/api/kernels/{s}/restart", None),
        ("DELETE", lambda s: f"/api/kernels/{s}", None),
        ("GET", lambda s: f"/api/kernels/{s}/channels", None),
    ]
    statuses = set()
    for token in [BOB, ADMIN]:
        for method, path_of, body in routes:
            statuses.add(same_as_missing(method, path_of, token, "a-only", "z-none", body))
    assert 404 in statuses, statuses
    # ...and as fast: the same code path (a key nobody has). Interleaved
    # medians, with a wide bound for a loaded machine.
    import time
    took = {"a-only": [], "z-none": []}
    for _ in range(40):
        for name in took:
            t0 = time.perf_counter()
            http("GET", f"/v1/sessions/{name}/history", token=BOB)
            took[name].append(time.perf_counter() - t0)
    med = {k: sorted(v)[len(v) // 2] for k, v in took.items()}
    assert 1 / 3 < med["a-only"] / med["z-none"] < 3, med
    # None of that touched alice's session, its state or its files.
    assert value("a-only", "secret") == "42"
    s, body, _ = http("GET", "/v1/sessions/a-only/files/f.txt", raw=True)
    assert (s, body) == (200, "alice's"), (s, body)

    # Listings show the caller's sessions by its own names.
    def owners(token):
        s, ks = http("GET", "/v1/kernels", token=token)
        assert s == 200, ks
        return sorted(k["owner"] for k in ks)

    assert owners(ALICE) == ["a-only", "s1"], owners(ALICE)
    assert owners(BOB) == ["s1"], owners(BOB)
    admin_owners = owners(ADMIN)
    assert {"alice:a-only", "alice:s1", "bob:s1", "s1"} <= set(admin_owners), admin_owners
    for k in http("GET", "/v1/kernels", token=ALICE)[1]:
        assert k["key"].startswith(k["owner"] + "/"), k
    s, rows = http("GET", "/v1/history", token=BOB)
    assert s == 200 and rows, rows
    assert {r["session"] for r in rows} == {"s1"} and {r["tenant"] for r in rows} == {"bob"}, rows
    assert all("alice" not in r["code"] for r in rows), rows
    s, rows = http("GET", "/v1/sessions/s1/history", token=ALICE)
    assert s == 200 and [r["code"] for r in rows][0].startswith("x = 'alice'"), rows
    s, rows = http("GET", "/v1/history?limit=1000", token=ADMIN)
    tenants = {(r["session"], r.get("tenant")) for r in rows}
    assert {("alice:s1", "alice"), ("bob:s1", "bob"), ("s1", None)} <= tenants, tenants

    # The dashboard: /?token= sets the cookie its data requests carry.
    s, _, hdrs = http("GET", "/?token=" + BOB, token=None, raw=True)
    cookie = hdrs.get("set-cookie", "").split(";")[0]
    assert s == 200 and cookie, hdrs
    s, ks = http("GET", "/v1/kernels", token=None, headers={"Cookie": cookie})
    assert s == 200 and sorted(k["owner"] for k in ks) == ["s1"], ks

    # /metrics: per-tenant counts under a tenant label; a tenant sees its own.
    s, m, _ = http("GET", "/metrics", token=ADMIN, raw=True)
    assert 'cellhost_tenant_kernels_live{tenant="alice"} 2' in m, m
    assert 'cellhost_tenant_kernels_live{tenant="bob"} 1' in m, m
    assert "cellhost_kernels_live " in m, m
    s, m, _ = http("GET", "/metrics", token=ALICE, raw=True)
    assert s == 200 and 'cellhost_tenant_kernels_live{tenant="alice"} 2' in m, m
    assert 'tenant="bob"' not in m and "cellhost_kernels_live " not in m, m
    assert 'cellhost_tenant_cells_total{tenant="alice",status="success"}' in m, m

    # A wrong token is nobody.
    s, r = http("GET", "/v1/kernels", token="alice-token-x")
    assert s == 401, (s, r)

    # Limits: 429 with Retry-After, counted.
    capped = "capped-token"
    run("c1", "1", capped)
    run("c1", "1", capped, child="k2")
    s, r, h = http("POST", "/v1/sessions/c1/execute", {"code": "1", "child": "k3"}, capped, raw=True)
    assert s == 429 and int(h["retry-after"]) >= 1 and "max_kernels" in r, (s, r, h)
    s, r, h = http("POST", "/v1/sessions/c2/execute", {"code": "1"}, capped, raw=True)
    assert s == 429 and int(h["retry-after"]) >= 1 and "max_sessions" in r, (s, r, h)
    run("c1", "2", capped)  # its own kernels still run
    http("DELETE", "/v1/sessions/c1", token=capped)
    run("c2", "1", capped)  # room again
    slow = "slow-token"
    for i in range(3):
        run("w", str(i), slow)
    s, r, h = http("POST", "/v1/sessions/w/execute", {"code": "3"}, slow, raw=True)
    assert s == 429 and 1 <= int(h["retry-after"]) <= 60 and "max_cells_per_minute" in r, (s, r, h)
    s, m, _ = http("GET", "/metrics", token=ADMIN, raw=True)
    assert 'cellhost_tenant_cells_refused_total{tenant="slow"} 1' in m, m
    assert 'cellhost_tenant_cells_refused_total{tenant="capped"} 2' in m, m
    # The admin is not limited by them.
    run("w", "1", ADMIN)
    print("OK http")


def check_jupyter():
    import websocket

    def ws_run(kernel, token, code):
        url = URL.replace("http://", "ws://") + f"/api/kernels/{kernel}/channels?token={token}"
        ws = websocket.create_connection(url, timeout=60)
        mid = uuid.uuid4().hex
        ws.send(json.dumps({
            "header": {"msg_id": mid, "msg_type": "execute_request", "session": "t",
                       "username": "t", "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }))
        out, reply = [], None
        while reply is None or not any(
                m.get("msg_type") == "status" and m["content"]["execution_state"] == "idle"
                for m in out):
            m = json.loads(ws.recv())
            m["msg_type"] = m["header"]["msg_type"]
            if m.get("parent_header", {}).get("msg_id") != mid:
                continue
            out.append(m)
            if m["msg_type"] == "execute_reply":
                reply = m
        ws.close()
        text = "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream")
        text += "".join(m["content"].get("evalue", "") for m in out if m["msg_type"] == "error")
        return reply["content"]["status"], text

    for token in [ALICE, BOB]:
        s, k = http("POST", "/api/kernels", {"id": "jk"}, token)
        assert s == 201 and k["id"] == "jk", (s, k)
    assert ws_run("jk", ALICE, "y = 'from alice'\nprint(y)") == ("ok", "from alice\n")
    st, text = ws_run("jk", BOB, "print(y)")
    assert st == "error" and "not defined" in text, (st, text)
    # A Jupyter kernel is the tenant's cellhost session of that id.
    assert value("jk", "y", ALICE) == "'from alice'"
    ids = lambda t: sorted(k["id"] for k in http("GET", "/api/kernels", token=t)[1])
    assert "jk" in ids(ALICE) and all(":" not in i for i in ids(ALICE)), ids(ALICE)
    assert ids(BOB) == ["jk", "s1"], ids(BOB)
    assert {"alice:jk", "bob:jk"} <= set(ids(ADMIN)), ids(ADMIN)
    # Jupyter sessions: same path, one per tenant; not-yours is not-there.
    body = {"path": "n.ipynb", "type": "notebook", "kernel": {"name": "python3"}}
    s, sa = http("POST", "/api/sessions", body, ALICE)
    s2, sb = http("POST", "/api/sessions", body, BOB)
    assert s == s2 == 201 and sa["id"] != sb["id"], (sa, sb)
    assert sa["kernel"]["id"] != sb["kernel"]["id"], (sa, sb)
    assert [x["id"] for x in http("GET", "/api/sessions", token=BOB)[1]] == [sb["id"]]
    other = str(uuid.uuid4())
    for method, body in [("GET", None), ("PATCH", {"path": "m.ipynb"}), ("DELETE", None)]:
        same_as_missing(method, lambda i: f"/api/sessions/{i}", BOB, sa["id"], other, body)
    assert http("GET", f"/api/sessions/{sa['id']}", token=ALICE)[0] == 200
    assert http("GET", f"/api/sessions/{sa['id']}", token=ADMIN)[0] == 200
    # The WebSocket of alice's kernel does not open for bob.
    try:
        ws_run("a-jk-only", BOB, "1")
        raise AssertionError("bob opened a kernel nobody gave him")
    except websocket.WebSocketBadStatusException as e:
        assert e.status_code == 404, e
    # A tenant registers at most max_sessions Jupyter kernels.
    capped = "capped-token"
    s, k = http("POST", "/api/kernels", {"id": "cj1"}, capped)
    assert s == 201, (s, k)
    s, r, h = http("POST", "/api/kernels", {"id": "cj2"}, capped, raw=True)
    assert s == 429 and int(h["retry-after"]) >= 1 and "max_sessions" in r, (s, r, h)
    assert http("DELETE", "/api/kernels/cj1", token=capped)[0] == 204
    print("OK jupyter")


async def check_mcp():
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    def client(token):
        return httpx2.AsyncClient(headers={"Authorization": "Bearer " + token},
                                  timeout=httpx2.Timeout(120.0))

    def text(r):
        return "\n".join(c.text for c in r.content if getattr(c, "type", "") == "text")

    async def owners(s):
        r = await s.call_tool("list_kernels", {})
        return {k["owner"] for k in r.structured_content["kernels"]}

    url = URL + "/mcp"
    async with streamable_http_client(url, http_client=client(ALICE)) as (ra, wa):
        async with ClientSession(ra, wa) as a:
            await a.initialize()
            async with streamable_http_client(url, http_client=client(BOB)) as (rb, wb):
                async with ClientSession(rb, wb) as b:
                    await b.initialize()
                    await a.call_tool("execute_code", {"code": "z = 'a'", "session": "conv"})
                    await b.call_tool("execute_code", {"code": "z = 'b'", "session": "conv"})
                    r = await a.call_tool("execute_code", {"code": "z", "session": "conv"})
                    assert "'a'" in text(r) and "'b'" not in text(r), text(r)
                    r = await b.call_tool("execute_code", {"code": "z", "session": "conv"})
                    assert "'b'" in text(r), text(r)
                    # The tenant's HTTP session, from MCP.
                    r = await b.call_tool("execute_code", {"code": "x", "session": "s1"})
                    assert "'bob'" in text(r), text(r)
                    # Implicit kernels, one per MCP session.
                    await a.call_tool("execute_code", {"code": "1"})
                    await b.call_tool("execute_code", {"code": "1"})
                    oa, ob = await owners(a), await owners(b)
                    assert "conv" in oa and "a-only" in oa and all(":" not in o for o in oa), oa
                    assert "a-only" not in ob and "conv" in ob, ob
                    assert not (oa - {"conv", "s1", "jk"}) & ob, (oa, ob)
                    # Bob resets and interrupts "a-only": his own, which has none.
                    r = await b.call_tool("reset_session", {"session": "a-only"})
                    assert "had no kernel" in text(r), text(r)
                    r = await b.call_tool("interrupt", {"session": "a-only"})
                    assert "No cell was running" in text(r), text(r)
                    assert value("a-only", "secret") == "42"
                    async with streamable_http_client(url, http_client=client(ADMIN)) as (rc, wc):
                        async with ClientSession(rc, wc) as c:
                            await c.initialize()
                            oc = await owners(c)
                            assert {"alice:conv", "bob:conv", "alice:a-only"} <= oc, oc
                            r = await c.call_tool("execute_code",
                                                  {"code": "z", "session": "alice:conv"})
                            assert "'a'" in text(r), text(r)
    # An MCP session is bound to the token that opened it: another
    # tenant naming its id gets what an unknown id gets.
    accept = {"Accept": "application/json, text/event-stream"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "raw", "version": "0"}}}
    s, _, h = http("POST", "/mcp", init, ALICE, headers=accept, raw=True)
    sid = h["mcp-session-id"]
    assert s == 200 and sid, (s, h)
    http("POST", "/mcp", {"jsonrpc": "2.0", "method": "notifications/initialized"}, ALICE,
         headers={**accept, "Mcp-Session-Id": sid}, raw=True)
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    nobody = str(uuid.uuid4())
    for method, body in [("POST", listing), ("GET", None), ("DELETE", None)]:
        theirs = http(method, "/mcp", body, BOB, headers={**accept, "Mcp-Session-Id": sid}, raw=True)
        missing = http(method, "/mcp", body, BOB, headers={**accept, "Mcp-Session-Id": nobody},
                       raw=True)
        assert theirs[:2] == missing[:2], (method, theirs, missing)
        assert method == "DELETE" or theirs[0] == 404, (method, theirs)
    # Bob's DELETE closed nothing: alice's session still answers.
    s, text_, _ = http("POST", "/mcp", listing, ALICE, headers={**accept, "Mcp-Session-Id": sid},
                       raw=True)
    assert s == 200 and "execute_code" in text_, (s, text_)
    s, _, _ = http("DELETE", "/mcp", None, ALICE, headers={"Mcp-Session-Id": sid}, raw=True)
    assert s == 200, s
    print("OK mcp")


if __name__ == "__main__":
    which = sys.argv[1]
    if which == "http":
        check_http()
    elif which == "jupyter":
        check_jupyter()
    elif which == "mcp":
        import anyio
        anyio.run(check_mcp)
    else:
        sys.exit(f"unknown scenario {which}")
