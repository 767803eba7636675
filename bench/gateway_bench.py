"""Warm `x=1` round trips (issue 21): cellhost over the Jupyter WebSocket,
cellhost over its own HTTP path, and Jupyter Kernel Gateway + ipykernel
over the same WebSocket protocol, in one run. Prints medians and ratios.

    python bench/gateway_bench.py CELLHOST_BIN KG_VENV_PYTHON [N]

CELLHOST_BIN: a built `cellhost`; KG_VENV_PYTHON: a Python with
jupyter_kernel_gateway, ipykernel and websocket-client installed.
"""
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import websocket

BIN, N = sys.argv[1], int(sys.argv[3]) if len(sys.argv) > 3 else 200
TOKEN = "bench-" + uuid.uuid4().hex


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_http(url, headers):
    for _ in range(600):
        try:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2).read()
            return
        except Exception:
            time.sleep(0.1)
    raise SystemExit("server did not come up: " + url)


def ws_loop(base, headers, n):
    req = urllib.request.Request(base + "/api/kernels", data=b'{"name": "python3"}', method="POST",
                                 headers=dict(headers, **{"Content-Type": "application/json"}))
    kid = json.loads(urllib.request.urlopen(req, timeout=60).read())["id"]
    ws = websocket.create_connection(base.replace("http", "ws") + f"/api/kernels/{kid}/channels",
                                     header=[f"{k}: {v}" for k, v in headers.items()], timeout=60)
    sess = uuid.uuid4().hex

    def once():
        mid = uuid.uuid4().hex
        ws.send(json.dumps({"header": {"msg_id": mid, "msg_type": "execute_request", "username": "b",
                                       "session": sess, "date": "", "version": "5.3"},
                            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                            "content": {"code": "x=1", "silent": False, "store_history": True,
                                        "user_expressions": {}, "allow_stdin": False}}))
        reply = idle = False
        while not (reply and idle):
            m = json.loads(ws.recv())
            if m["parent_header"].get("msg_id") != mid:
                continue
            reply = reply or m["msg_type"] == "execute_reply"
            idle = idle or (m["msg_type"] == "status" and m["content"]["execution_state"] == "idle")

    for _ in range(10):
        once()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        once()
        times.append(time.perf_counter() - t)
    ws.close()
    return statistics.median(times)


def http_loop(host, prt, n):
    c = http.client.HTTPConnection(host, prt)
    body = json.dumps({"code": "x=1"})
    h = {"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"}

    def once():
        c.request("POST", "/v1/sessions/bench-http/execute", body, h)
        r = c.getresponse()
        r.read()
        assert r.status == 200

    for _ in range(10):
        once()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        once()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    data = tempfile.mkdtemp()
    cp = port()
    env = dict(os.environ, CELLHOST_TOKEN=TOKEN)
    ch = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{cp}", "--sandbox", "none",
                           "--data-dir", data], env=env, stdout=subprocess.DEVNULL)
    kp = port()
    kg = subprocess.Popen([sys.argv[2], "-m", "kernel_gateway", f"--KernelGatewayApp.port={kp}",
                           "--KernelGatewayApp.ip=127.0.0.1", f"--KernelGatewayApp.auth_token={TOKEN}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        auth = {"Authorization": "token " + TOKEN}
        wait_http(f"http://127.0.0.1:{cp}/api", auth)
        wait_http(f"http://127.0.0.1:{kp}/api", auth)
        ws_c = ws_loop(f"http://127.0.0.1:{cp}", auth, N)
        http_c = http_loop("127.0.0.1", cp, N)
        ws_k = ws_loop(f"http://127.0.0.1:{kp}", auth, N)
    finally:
        ch.terminate()
        kg.terminate()
        ch.wait(30)
        kg.wait(30)
    print(f"warm x=1, median of {N}:")
    print(f"  cellhost Jupyter WebSocket   {ws_c * 1e3:8.3f} ms")
    print(f"  cellhost HTTP /v1 execute    {http_c * 1e3:8.3f} ms")
    print(f"  Kernel Gateway + ipykernel   {ws_k * 1e3:8.3f} ms")
    print(f"  Kernel Gateway / cellhost WS: {ws_k / ws_c:.1f}x   cellhost WS / HTTP: {ws_c / http_c:.2f}x")


if __name__ == "__main__":
    main()
