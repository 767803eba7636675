"""Real Jupyter clients against a real `cellhost serve` (issue 21).

Run by crates/cellhost-cli/tests/jupyter.rs as
    python clients.py CHECK URL TOKEN
with the interpreter of the .venv-jupyter venv (scripts/test makes it).
Each CHECK is one function below; it raises AssertionError (exit 1) when
cellhost answers wrong.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

URL, TOKEN = sys.argv[2], sys.argv[3]
HOST = URL.split("//", 1)[1]


def http(method, path, body=None, base=URL, token=TOKEN):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Authorization", "token " + token)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read()
        return r.status, (json.loads(text) if text else None)


# ---- a raw WebSocket client ---------------------------------------------------

import websocket  # websocket-client


class Raw:
    """One kernel WebSocket, messages read in order."""

    def __init__(self, kernel, base_ws=None, query_token=True):
        base_ws = base_ws or ("ws://" + HOST)
        url = f"{base_ws}/api/kernels/{kernel}/channels"
        if query_token:
            url += "?token=" + TOKEN
        self.ws = websocket.create_connection(url, timeout=60)
        self.session = uuid.uuid4().hex

    def send(self, msg_type, content, channel="shell"):
        msg_id = uuid.uuid4().hex
        msg = {
            "header": {"msg_id": msg_id, "msg_type": msg_type, "username": "t",
                       "session": self.session, "date": "", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "content": content,
            "channel": channel, "buffers": [],
        }
        self.ws.send(json.dumps(msg))
        return msg_id

    def recv(self):
        return json.loads(self.ws.recv())

    def until_idle(self, msg_id, need_reply=True):
        """Every message parented by msg_id until its reply and idle."""
        got, reply, idle = [], None, False
        while not (idle and (reply or not need_reply)):
            m = self.recv()
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            got.append(m)
            if m["channel"] in ("shell", "control"):
                reply = m
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                idle = True
        return got, reply

    def execute(self, code, **kw):
        mid = self.send("execute_request", dict({"code": code, "silent": False,
                        "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}, **kw))
        return self.until_idle(mid)


def types(msgs):
    return [m["msg_type"] + ("" if m["msg_type"] != "status"
            else ":" + m["content"]["execution_state"]) for m in msgs]


def new_kernel(**body):
    st, model = http("POST", "/api/kernels", dict({"name": "python3"}, **body))
    assert st == 201, st
    return model["id"]


def check_raw_protocol():
    k = new_kernel()
    a = Raw(k)
    mid = a.send("kernel_info_request", {})
    got, reply = a.until_idle(mid)
    assert reply["msg_type"] == "kernel_info_reply", reply
    assert reply["content"]["language_info"]["name"] == "python"
    assert reply["parent_header"]["msg_id"] == mid

    got, reply = a.execute("x = 41\nprint('hi')\nx + 1")
    t = types(got)
    assert t[0] == "status:busy" and t[1] == "execute_input", t
    assert t[-1] == "status:idle" and t[-2] == "execute_reply", t
    streams = "".join(m["content"]["text"] for m in got if m["msg_type"] == "stream")
    assert streams == "hi\n", streams
    res = [m for m in got if m["msg_type"] == "execute_result"][0]
    assert res["content"]["data"]["text/plain"] == "42", res
    assert reply["content"]["status"] == "ok"
    assert reply["content"]["execution_count"] == 1, reply["content"]
    assert reply["metadata"]["cellhost"]["kernel"]["reused"] is False

    # State kept; live output arrives before the cell ends.
    mid = a.send("execute_request", {"code": "import time\nprint(x, flush=True)\ntime.sleep(1.5)\nprint('end')"})
    first = None
    t0 = time.time()
    while first is None:
        m = a.recv()
        if m["msg_type"] == "stream":
            first = (m["content"]["text"], time.time() - t0)
    assert first[0] == "41\n" and first[1] < 1.2, first
    a.until_idle(mid)

    got, reply = a.execute("display({'text/html': '<b>x</b>', 'text/plain': 'x'}, raw=True)\n1/0")
    disp = [m for m in got if m["msg_type"] == "display_data"]
    assert disp and disp[0]["content"]["data"]["text/html"] == "<b>x</b>", types(got)
    err = [m for m in got if m["msg_type"] == "error"][0]["content"]
    assert err["ename"] == "ZeroDivisionError" and err["evalue"] == "division by zero", err
    assert any("1/0" in line for line in err["traceback"]), err
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "ZeroDivisionError"

    # Introspection answered by the kernel, not counted.
    mid = a.send("complete_request", {"code": "y = x.bit_", "cursor_pos": 10})
    _, r = a.until_idle(mid)
    assert "x.bit_length" in r["content"]["matches"] and r["content"]["cursor_start"] == 4, r["content"]
    mid = a.send("inspect_request", {"code": "len", "cursor_pos": 3, "detail_level": 0})
    _, r = a.until_idle(mid)
    assert r["content"]["found"] and "Return the number" in r["content"]["data"]["text/plain"], r
    for code, want in [("for i in range(3):", "incomplete"), ("x = 1", "complete"), ("x = )", "invalid")]:
        mid = a.send("is_complete_request", {"code": code})
        _, r = a.until_idle(mid)
        assert r["content"]["status"] == want, (code, r["content"])
    got, reply = a.execute("x")
    assert reply["content"]["execution_count"] == 4, reply["content"]  # hidden cells not counted

    # No comms, unknown requests answered, stdin closed.
    mid = a.send("comm_info_request", {})
    _, r = a.until_idle(mid, need_reply=False) if False else (None, None)
    r = a.recv()
    assert r["msg_type"] == "comm_info_reply" and r["content"]["comms"] == {}, r
    mid = a.send("frobnicate_request", {})
    r = a.recv()
    assert r["msg_type"] == "frobnicate_reply" and r["content"]["status"] == "error", r
    got, reply = a.execute("input('name? ')")
    text = "".join(m["content"]["text"] for m in got if m["msg_type"] == "stream")
    assert "stdin" in text and reply["content"]["ename"] == "EOFError", (text, reply["content"])
    print("raw protocol ok")


RICH_CLASS = r"""
class Rich:
    def _repr_html_(self): return "<b>rich</b>"
    def _repr_markdown_(self): return "**rich**"
    def _repr_latex_(self): return "$x^2$"
    def _repr_json_(self): return {"rich": [1, 2]}
    def _repr_svg_(self): return "<svg xmlns='http://www.w3.org/2000/svg'/>"
    def _repr_png_(self): return b"\x89PNG\r\n\x1a\nfake"
    def __repr__(self): return "Rich()"

class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/html": "<i>bundle</i>", "application/vnd.test+json": {"k": 1}}
    def __repr__(self): return "Bundle()"
"""


def v1_execute(session, code):
    req = urllib.request.Request(URL + f"/v1/sessions/{session}/execute",
                                 data=json.dumps({"code": code}).encode(), method="POST")
    req.add_header("Authorization", "Bearer " + TOKEN)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def check_iopub_order():
    """iopub has prints and displays in the order the cell made them
    (they leave the kernel on separate pipes)."""
    a = Raw(new_kernel())
    for _ in range(3):
        seq, _ = a.execute("for i in range(30):\n    print('o%d' % i, 'x' * 300)\n    display('d%d' % i)")
        order = []
        for m in seq:
            if m["msg_type"] == "stream":
                order += [line.split(" ")[0] for line in m["content"]["text"].splitlines()]
            elif m["msg_type"] == "display_data":
                order.append(m["content"]["data"]["text/plain"].strip("'"))
        assert order == [w for i in range(30) for w in ("o%d" % i, "d%d" % i)], order
    print("iopub order ok")


def check_rich_result():
    """A value's rich reprs travel in its execute_result, as IPython's display
    formatter puts them there, and are not sent twice as display_data."""
    import base64
    k = new_kernel()
    a = Raw(k)
    got, reply = a.execute("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    assert reply["content"]["status"] == "ok", reply["content"]
    assert "display_data" not in types(got), types(got)
    res = [m for m in got if m["msg_type"] == "execute_result"]
    assert len(res) == 1, types(got)
    data = res[0]["content"]["data"]
    assert "<table" in data.get("text/html", "") and "dataframe" in data["text/html"], data
    assert "a  b" in data["text/plain"] and "x" in data["text/plain"], data
    assert res[0]["content"]["execution_count"] == 1, res[0]["content"]

    got, reply = a.execute(RICH_CLASS + "\nRich()")
    assert "display_data" not in types(got), types(got)
    data = [m for m in got if m["msg_type"] == "execute_result"][0]["content"]["data"]
    assert data["text/plain"] == "Rich()", data
    assert data["text/html"] == "<b>rich</b>" and data["text/markdown"] == "**rich**", data
    assert data["text/latex"] == "$x^2$", data
    assert data["application/json"] == {"rich": [1, 2]}, data
    assert data["image/svg+xml"].startswith("<svg"), data
    assert base64.b64decode(data["image/png"]) == b"\x89PNG\r\n\x1a\nfake", data
    got, reply = a.execute("Bundle()")
    data = [m for m in got if m["msg_type"] == "execute_result"][0]["content"]["data"]
    assert data == {"text/html": "<i>bundle</i>", "application/vnd.test+json": {"k": 1},
                    "text/plain": "Bundle()"}, data
    # display() stays display_data; a plain value stays text/plain only.
    got, reply = a.execute("display(Rich())\n7")
    disp = [m for m in got if m["msg_type"] == "display_data"]
    assert len(disp) == 1 and disp[0]["content"]["data"]["text/html"] == "<b>rich</b>", types(got)
    data = [m for m in got if m["msg_type"] == "execute_result"][0]["content"]["data"]
    assert data == {"text/plain": "7"}, data
    # cellhost's own result: `value` stays the repr; `value_display` names
    # the display that is the value's bundle.
    r = v1_execute(k, "Rich()")
    assert r["value"] == "Rich()", r
    vd = r["value_display"]
    items = {d["mime"]: d["data"] for d in r["displays"] if d["display"] == vd}
    assert items["text/html"] == "<b>rich</b>", r
    r = v1_execute(k, "display(Rich())\n8")
    assert "value_display" not in r and r["displays"], r
    print("rich result ok")


def check_two_sockets_and_malformed():
    k = new_kernel()
    a, b = Raw(k), Raw(k)
    assert http("GET", f"/api/kernels/{k}")[1]["connections"] == 2
    mid = a.send("execute_request", {"code": "print('shared')"})
    got_a, reply_a = a.until_idle(mid)
    got_b, reply_b = b.until_idle(mid, need_reply=False)
    assert reply_a["msg_type"] == "execute_reply"
    assert reply_b is None, "the reply goes only to the socket that asked"
    assert "stream" in types(got_b), types(got_b)
    # Malformed frames: the sender is told, the socket and the other stay.
    b.ws.send("{not json")
    m = b.recv()
    assert m["msg_type"] == "stream" and "not JSON" in m["content"]["text"], m
    b.ws.send(json.dumps({"header": {"msg_id": "x"}}))
    m = b.recv()
    assert "msg_type" in m["content"]["text"], m
    got, reply = a.execute("1 + 1")
    assert reply["content"]["status"] == "ok"
    got, reply = b.execute("2 + 2")
    assert [m for m in got if m["msg_type"] == "execute_result"][0]["content"]["data"]["text/plain"] == "4"
    print("two sockets ok")


def check_interrupt_and_state_note():
    k = new_kernel()
    a = Raw(k)
    a.execute("y = 7")
    mid = a.send("execute_request", {"code": "import time\nprint('go', flush=True)\ntime.sleep(30)"})
    while True:
        m = a.recv()
        if m["msg_type"] == "stream":
            break
    a.send("interrupt_request", {}, channel="control")
    got, reply = a.until_idle(mid)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
    got, reply = a.execute("y")
    assert [m for m in got if m["msg_type"] == "execute_result"][0]["content"]["data"]["text/plain"] == "7"
    # A cell that loses the kernel: the next cell says so before its reply.
    a.execute("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    got, reply = a.execute("print('after')")
    t = types(got)
    notes = [m for m in got if m["msg_type"] == "stream" and m["content"]["name"] == "stderr"]
    assert notes and "cellhost:" in notes[0]["content"]["text"], t
    assert t.index("stream") < t.index("execute_reply")
    md = reply["metadata"]["cellhost"]
    assert md["kernel"]["reused"] is False and "fresh kernel" in md["state_note"], md
    # Interrupt and restart over REST.
    assert http("POST", f"/api/kernels/{k}/interrupt")[0] == 204
    st, model = http("POST", f"/api/kernels/{k}/restart", {})
    assert st == 200 and model["id"] == k
    got, reply = a.execute("y")
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "NameError", reply["content"]
    assert http("DELETE", f"/api/kernels/{k}")[0] == 204
    try:
        http("GET", f"/api/kernels/{k}")
        raise AssertionError("a deleted kernel is gone")
    except urllib.error.HTTPError as e:
        assert e.code == 404
    print("interrupt ok")


def check_shared_session():
    # A Jupyter kernel is a cellhost session: HTTP and WebSocket share state.
    sid = "shared-" + uuid.uuid4().hex[:8]
    req = urllib.request.Request(URL + f"/v1/sessions/{sid}/execute",
                                 data=json.dumps({"code": "z = 'from http'"}).encode(), method="POST")
    req.add_header("Authorization", "Bearer " + TOKEN)
    req.add_header("Content-Type", "application/json")
    urllib.request.urlopen(req, timeout=60).read()
    k = new_kernel(id=sid)
    assert k == sid
    assert sid in [m["id"] for m in http("GET", "/api/kernels")[1]]
    got, reply = Raw(k).execute("z")
    assert [m for m in got if m["msg_type"] == "execute_result"][0]["content"]["data"]["text/plain"] == "'from http'"
    # Auth: without a token, refused; a wrong one too.
    try:
        http("GET", "/api/kernels", token="wrong")
        raise AssertionError("a wrong token is refused")
    except urllib.error.HTTPError as e:
        assert e.code == 401
    try:
        Raw(k, query_token=False)
        raise AssertionError("a WebSocket without a token is refused")
    except websocket.WebSocketBadStatusException as e:
        assert e.status_code == 401
    # Sessions API.
    st, s = http("POST", "/api/sessions", {"path": "a.ipynb", "type": "notebook", "kernel": {"id": sid}})
    assert st == 201 and s["kernel"]["id"] == sid
    assert [x["id"] for x in http("GET", "/api/sessions")[1]] == [s["id"]]
    assert http("DELETE", f"/api/sessions/{s['id']}")[0] == 204
    print("shared session ok")


# ---- Jupyter Server as a gateway client ------------------------------------------

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class JupyterServer:
    """`jupyter server --gateway-url=cellhost`. own_token: its own (None: a
    random one); env_token: cellhost's token as JUPYTER_GATEWAY_AUTH_TOKEN,
    else as --GatewayClient.auth_token."""

    def __init__(self, own_token=None, env_token=True, cmd=None, extra=(), files=None):
        self.port = free_port()
        self.token = uuid.uuid4().hex if own_token is None else own_token
        self.dir = tempfile.mkdtemp()
        # Extensions these tests do not use (jupyter_lsp scans for language
        # servers at start) stay off.
        with open(os.path.join(self.dir, "jupyter_server_config.json"), "w") as f:
            json.dump({"ServerApp": {"jpserver_extensions": {
                "jupyter_lsp": False, "jupyter_server_terminals": False}}}, f)
        for name, text in (files or {}).items():
            with open(os.path.join(self.dir, name), "w") as f:
                f.write(text)
        env = dict(os.environ, JUPYTER_CONFIG_DIR=self.dir, JUPYTERLAB_SETTINGS_DIR=self.dir,
                   JUPYTERLAB_WORKSPACES_DIR=self.dir,
                   JUPYTER_DATA_DIR=self.dir, JUPYTER_RUNTIME_DIR=self.dir)
        env.pop("JUPYTER_GATEWAY_AUTH_TOKEN", None)
        env.pop("JUPYTER_GATEWAY_URL", None)
        # A tokenless relay takes API calls without a browser's XSRF cookie.
        args = ["--ServerApp.disable_check_xsrf=True"] if self.token == "" else []
        if env_token:
            env["JUPYTER_GATEWAY_AUTH_TOKEN"] = TOKEN
        else:
            args.append(f"--GatewayClient.auth_token={TOKEN}")
        self.proc = subprocess.Popen(
            (cmd or [sys.executable, "-m", "jupyter_server"]) + ["--no-browser", "--allow-root", f"--port={self.port}",
             "--ip=127.0.0.1", f"--IdentityProvider.token={self.token}",
             f"--gateway-url={URL}", f"--ServerApp.root_dir={self.dir}"] + args + list(extra),
            env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, "log"), "w"))
        self.base = f"http://127.0.0.1:{self.port}"
        # Generous: with jupyterlab installed every server loads its
        # extensions, and the test machine may be busy.
        end = time.time() + 120
        while time.time() < end and self.proc.poll() is None:
            try:
                http("GET", "/api/status", base=self.base, token=self.token)
                return
            except Exception:
                time.sleep(0.1)
        self.stop()
        raise AssertionError("jupyter server did not start: " + open(os.path.join(self.dir, "log")).read())

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


def check_jupyter_server():
    js = JupyterServer()
    try:
        st, specs = http("GET", "/api/kernelspecs", base=js.base, token=js.token)
        assert "python3" in specs["kernelspecs"], specs
        st, model = http("POST", "/api/kernels", {"name": "python3"}, base=js.base, token=js.token)
        k = model["id"]
        # The kernel lives in cellhost: the same id there.
        assert k in [m["id"] for m in http("GET", "/api/kernels")[1]]
        ws = Raw.__new__(Raw)
        ws.session = uuid.uuid4().hex
        ws.ws = websocket.create_connection(
            f"ws://127.0.0.1:{js.port}/api/kernels/{k}/channels?token={js.token}", timeout=60)
        got, reply = ws.execute("import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
                                "display({'text/markdown': '**m**'}, raw=True)\nv = 5\nv * 2")
        t = types(got)
        names = sorted(m["content"]["name"] for m in got if m["msg_type"] == "stream")
        assert names == ["stderr", "stdout"], t
        assert "display_data" in t and "execute_result" in t, t
        got, reply = ws.execute("undefined_name")
        assert reply["content"]["ename"] == "NameError", reply["content"]
        assert "error" in types(got)
        # Interrupt through Jupyter Server's REST (it calls cellhost's).
        mid = ws.send("execute_request", {"code": "import time\nprint('go', flush=True)\ntime.sleep(30)"})
        while ws.recv()["msg_type"] != "stream":
            pass
        http("POST", f"/api/kernels/{k}/interrupt", {}, base=js.base, token=js.token)
        got, reply = ws.until_idle(mid)
        assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        got, reply = ws.execute("v")
        assert reply["content"]["status"] == "ok"
        http("POST", f"/api/kernels/{k}/restart", {}, base=js.base, token=js.token)
        got, reply = ws.execute("v")
        assert reply["content"]["ename"] == "NameError", reply["content"]
        assert http("DELETE", f"/api/kernels/{k}", base=js.base, token=js.token)[0] == 204
        assert k not in [m["id"] for m in http("GET", "/api/kernels")[1]]
    finally:
        js.stop()
    print("jupyter server ok")


def run_notebook(gateway_url, gateway_token):
    """A notebook through Jupyter Server's gateway kernel manager (what
    nbclient/papermill use with --gateway-url), outputs checked."""
    os.environ["JUPYTER_GATEWAY_URL"] = gateway_url
    os.environ.pop("JUPYTER_GATEWAY_AUTH_TOKEN", None)
    if gateway_token:
        os.environ["JUPYTER_GATEWAY_AUTH_TOKEN"] = gateway_token
    import nbformat
    from nbclient import NotebookClient
    from jupyter_server.gateway.gateway_client import GatewayClient
    from jupyter_server.gateway.managers import GatewayKernelManager

    GatewayClient.instance()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("a = 20\nprint('hello')"),
        nbformat.v4.new_code_cell("a + 22"),
        nbformat.v4.new_code_cell("display({'text/html': '<i>h</i>', 'text/plain': 'h'}, raw=True)"),
        nbformat.v4.new_code_cell("class T:\n    def _repr_html_(self): return '<table>t</table>'\nT()"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    km = GatewayKernelManager()
    client = NotebookClient(nb, km=km, timeout=60, kernel_name="python3")
    client.execute()
    c0, c1, c2, c3 = nb.cells
    assert c0.outputs[0]["name"] == "stdout" and c0.outputs[0]["text"] == "hello\n", c0.outputs
    assert c1.outputs[0]["output_type"] == "execute_result", c1.outputs
    assert c1.outputs[0]["data"]["text/plain"] == "42" and c1.execution_count == 2, c1
    assert c2.outputs[0]["output_type"] == "display_data" and c2.outputs[0]["data"]["text/html"] == "<i>h</i>"
    assert [o["output_type"] for o in c3.outputs] == ["execute_result"], c3.outputs
    assert c3.outputs[0]["data"]["text/html"] == "<table>t</table>", c3.outputs
    # A failing cell raises in nbclient, with cellhost's error.
    nb2 = nbformat.v4.new_notebook()
    nb2.cells = [nbformat.v4.new_code_cell("raise ValueError('nope')")]
    try:
        NotebookClient(nb2, km=GatewayKernelManager(), timeout=60, kernel_name="python3").execute()
        raise AssertionError("the error cell raises")
    except Exception as e:
        assert "ValueError" in str(e) and "nope" in str(e), e


def check_nbclient():
    run_notebook(URL, TOKEN if TOKEN != "none" else None)
    print("nbclient ok")


def check_nbclient_token():
    """cellhost has a token. jupyter_server's GatewayKernelClient opens its
    WebSocket without headers, so nbclient goes through a loopback Jupyter
    Server (no token of its own) whose gateway client holds cellhost's token
    (--GatewayClient.auth_token): REST and the WebSocket relay carry it."""
    js = JupyterServer(own_token="", env_token=False)
    try:
        run_notebook(js.base, None)
        # The kernels lived on cellhost, under its token.
        st, kernels = http("GET", "/api/kernels")
        assert st == 200
    finally:
        js.stop()
    log = open(os.path.join(js.dir, "log")).read()
    import re
    # No request the relay made to cellhost was refused (Tornado logs a
    # refused one as `... 401 GET ...` or `HTTP 401`).
    assert not re.search(r"\b401 (GET|POST|DELETE|PATCH)\b|HTTP 401", log), log
    print("nbclient token ok")


# ---- JupyterLab in headless Chromium (WebDriver, as tests/dashboard.rs) ---------

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


class WebDriver:
    def __init__(self):
        for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
            assert os.path.exists(path), f"{path} is missing: apt-get install -y {pkg} (scripts/test does)"
        self.port = free_port()
        self.profile = tempfile.mkdtemp()
        # Its own process group: chromedriver and the browser die together.
        self.proc = subprocess.Popen([CHROMEDRIVER, f"--port={self.port}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900", f"--user-data-dir={self.profile}"]}}}}
        self.session = self.call("POST", "/session", caps)["sessionId"]

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            raise AssertionError(f"webdriver {path}: {e.read()[:500]!r}")

    def s(self, path, body=None, method="POST"):
        return self.call(method, f"/session/{self.session}{path}", body)

    def js(self, script):
        return self.s("/execute/sync", {"script": script, "args": []})

    def wait(self, what, script, timeout=60):
        end = time.time() + timeout
        while True:
            got = self.js(script)
            if got:
                return got
            if time.time() > end:
                text = self.js("return document.body ? document.body.innerText : ''")
                raise AssertionError(f"the page never showed {what}:\n{text[:3000]}")
            time.sleep(0.2)

    def stop(self):
        try:
            self.s("", method="DELETE")
        except Exception:
            pass
        os.killpg(self.proc.pid, 9)
        self.proc.wait(10)


def check_png(data):
    """A real PNG: signature, IHDR first with a sane size, every chunk's CRC
    right, IDAT data that inflates, IEND last."""
    import struct
    import zlib
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    i, chunks, idat = 8, [], b""
    while i < len(data):
        n, = struct.unpack(">I", data[i:i + 4])
        kind, body = data[i + 4:i + 8], data[i + 8:i + 8 + n]
        crc, = struct.unpack(">I", data[i + 8 + n:i + 12 + n])
        assert zlib.crc32(kind + body) & 0xffffffff == crc, kind
        chunks.append(kind)
        if kind == b"IDAT":
            idat += body
        i += 12 + n
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND", chunks
    w, h = struct.unpack(">II", data[16:24])
    assert w >= 640 and h >= 480, (w, h)
    assert len(zlib.decompress(idat)) > w * h, "IDAT inflates to the image"
    return w, h


def check_jupyterlab():
    """`jupyter lab --gateway-url=cellhost` in headless Chromium: open a
    notebook, run its cell with Shift+Enter, see the output; screenshot."""
    import base64
    marker = "hello from jupyterlab on cellhost"
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": "c1", "metadata": {},
                     "outputs": [], "source": f"print({marker!r})\nclass T:\n"
                     "    def _repr_html_(self): return '<b>rich 42</b>'\n"
                     "    def __repr__(self): return 'T()'\nT()"}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (cellhost)",
                                      "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    lab = JupyterServer(cmd=[os.path.join(os.path.dirname(sys.executable), "jupyter-lab")], files={"t.ipynb": json.dumps(nb)},
                        extra=["--LabApp.news_url=", "--LabApp.check_for_updates_class="
                               "jupyterlab.NeverCheckForUpdate"])
    wd = None
    try:
        wd = WebDriver()
        wd.s("/url", {"url": f"{lab.base}/lab/tree/t.ipynb?token={lab.token}"})
        # The notebook is open and its kernel (on cellhost) idle.
        wd.wait("the notebook with an idle kernel",
                "return !!document.querySelector('.jp-Notebook .jp-Cell .cm-content') && "
                "document.body.innerText.includes('Idle')", timeout=90)
        editor = wd.s("/element", {"using": "css selector", "value": ".jp-Notebook .jp-Cell .cm-content"})
        eid = list(editor.values())[0]
        wd.s(f"/element/{eid}/click", {})
        wd.s("/actions", {"actions": [{"type": "key", "id": "kb", "actions": [
            {"type": "keyDown", "value": "\ue008"}, {"type": "keyDown", "value": "\ue007"},
            {"type": "keyUp", "value": "\ue007"}, {"type": "keyUp", "value": "\ue008"}]}]})
        out = wd.wait("the cell's output",
                      "const o = [...document.querySelectorAll('.jp-OutputArea-output')]"
                      ".map(e => e.innerText); return o.join('').includes('rich 42') && o", timeout=60)
        # The print, then the value as ipykernel sends it: one execute_result,
        # rendered from its text/html (no second display of the same value).
        assert len(out) == 2 and marker in out[0] and "T()" not in "".join(out), out
        rich = wd.js("const b = document.querySelector('.jp-OutputArea-output.jp-RenderedHTMLCommon b');"
                     "return b && b.innerText")
        assert rich == "rich 42", rich
        prompts = wd.js("return [...document.querySelectorAll('.jp-InputPrompt, .jp-OutputPrompt')]"
                        ".map(e => e.innerText.trim())")
        assert "[1]:" in prompts and prompts.count("[1]:") == 2, prompts
        png = base64.b64decode(wd.s("/screenshot", method="GET"))
        w, h = check_png(png)
        shot = os.environ.get("CELLHOST_SCREENSHOT")
        if shot:
            with open(shot, "wb") as f:
                f.write(png)
        # The kernel the page used is a cellhost session: the cell is in its history.
        kernels = http("GET", "/api/kernels")[1]
        assert kernels, kernels
        req = urllib.request.Request(URL + f"/v1/sessions/{kernels[0]['id']}/history")
        req.add_header("Authorization", "Bearer " + TOKEN)
        hist = urllib.request.urlopen(req, timeout=30).read().decode()
        assert marker in hist, hist[:2000]
    finally:
        if wd is not None:
            wd.stop()
        lab.stop()
    print(f"jupyterlab ok (screenshot {w}x{h})")


def check_ag2():
    from autogen.coding import CodeBlock
    from autogen.coding.jupyter import JupyterCodeExecutor, JupyterConnectionInfo

    host, port = HOST.split(":")
    info = JupyterConnectionInfo(host=host, use_https=False, port=int(port), token=TOKEN)
    with JupyterCodeExecutor(info, output_dir=tempfile.mkdtemp(), timeout=60) as ex:
        r = ex.execute_code_blocks([CodeBlock(code="n = 6\nprint(n * 7)", language="python")])
        assert r.exit_code == 0 and "42" in r.output, r
        r = ex.execute_code_blocks([CodeBlock(code="print(n + 1)", language="python")])
        assert r.exit_code == 0 and "7" in r.output, r
        r = ex.execute_code_blocks([CodeBlock(code="1/0", language="python")])
        assert r.exit_code != 0 and "ZeroDivisionError" in r.output, r
    print("ag2 ok")


if __name__ == "__main__":
    globals()["check_" + sys.argv[1]]()
