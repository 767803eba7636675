"""Warm `x=1` round trips (issue 21): cellhost over the Jupyter WebSocket,
cellhost over its own HTTP path, and Jupyter Kernel Gateway + ipykernel
over the same WebSocket protocol, in one run. Prints medians and ratios.

    python bench/gateway_bench.py CELLHOST_BIN KG_VENV_PYTHON [N] [BEFORE_BIN]

CELLHOST_BIN: a built `cellhost` (release: `cargo build --release -p
cellhost-cli`); KG_VENV_PYTHON: a Python with jupyter_kernel_gateway,
ipykernel and websocket-client installed (run this script with it too);
BEFORE_BIN: another `cellhost` build measured in the same run, for
before/after figures. Systems are measured in interleaved rounds.
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


def ws_client(base, headers):
    """A kernel on `base` and a warm `x=1` round trip over its WebSocket."""
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
            if m["msg_type"] == "execute_reply":
                assert m["content"]["status"] == "ok", m
                reply = True
            idle = idle or (m["msg_type"] == "status" and m["content"]["execution_state"] == "idle")

    return once


def http_client(host, prt):
    """A warm `x=1` round trip over cellhost's own POST /v1/sessions/{s}/execute."""
    c = http.client.HTTPConnection(host, prt)
    body = json.dumps({"code": "x=1"})
    h = {"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"}

    def once():
        c.request("POST", "/v1/sessions/bench-http/execute", body, h)
        r = c.getresponse()
        r.read()
        assert r.status == 200

    return once


def serve(binary):
    data = tempfile.mkdtemp()
    cp = port()
    env = dict(os.environ, CELLHOST_TOKEN=TOKEN)
    proc = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{cp}", "--sandbox", "none",
                             "--data-dir", data], env=env, stdout=subprocess.DEVNULL)
    return proc, cp


def main():
    auth = {"Authorization": "token " + TOKEN}
    bins = [("cellhost", BIN)] + ([("before", sys.argv[4])] if len(sys.argv) > 4 else [])
    procs, clients = [], []
    try:
        for name, binary in bins:
            proc, cp = serve(binary)
            procs.append(proc)
            wait_http(f"http://127.0.0.1:{cp}/api", auth)
            clients.append((f"{name} Jupyter WebSocket", ws_client(f"http://127.0.0.1:{cp}", auth)))
            clients.append((f"{name} HTTP /v1 execute", http_client("127.0.0.1", cp)))
        kp = port()
        procs.append(subprocess.Popen(
            [sys.argv[2], "-m", "kernel_gateway", f"--KernelGatewayApp.port={kp}",
             "--KernelGatewayApp.ip=127.0.0.1", f"--KernelGatewayApp.auth_token={TOKEN}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_http(f"http://127.0.0.1:{kp}/api", auth)
        clients.append(("Kernel Gateway + ipykernel", ws_client(f"http://127.0.0.1:{kp}", auth)))
        for _, once in clients:
            for _ in range(20):
                once()
        # Interleaved rounds, so drift on a shared machine hits all alike.
        rounds = 10
        times = {name: [] for name, _ in clients}
        for _ in range(rounds):
            for name, once in clients:
                for _ in range(max(1, N // rounds)):
                    t = time.perf_counter()
                    once()
                    times[name].append(time.perf_counter() - t)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"warm x=1, median of {len(next(iter(times.values())))} (10 interleaved rounds):")
    for name, m in med.items():
        print(f"  {name:34} {m * 1e3:8.3f} ms")
    ws, h, kg = (med["cellhost Jupyter WebSocket"], med["cellhost HTTP /v1 execute"],
                 med["Kernel Gateway + ipykernel"])
    print(f"  Kernel Gateway / cellhost WS: {kg / ws:.1f}x (target >= 10)   "
          f"cellhost WS / HTTP: {ws / h:.2f}x (target <= 1.5)")
    if "before Jupyter WebSocket" in med:
        bw, bh = med["before Jupyter WebSocket"], med["before HTTP /v1 execute"]
        print(f"  before: Kernel Gateway / WS: {kg / bw:.1f}x   WS / HTTP: {bw / bh:.2f}x   "
              f"before WS / this WS: {bw / ws:.2f}x")


if __name__ == "__main__":
    main()
