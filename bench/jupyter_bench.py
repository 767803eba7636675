"""Jupyter peer figures: jupyter_client + ipykernel, the way a host drives them.

Run with the bench venv's interpreter (bench/.venv/bin/python). Prints one
JSON object on stdout; everything else goes to stderr.

Figures:
  cold start   KernelManager.start_kernel() -> client.wait_for_ready(), and
               on to the first `x=1` execute_reply (repeated --cold times)
  idle RSS     VmRSS of the ipykernel process after its first cell
  warm loop    per cell: execute request -> execute_reply on shell AND
               status idle on iopub (so all output has arrived), for `x=1`
               and `print(1)`, --n cells each after --warmup cells
Times are in microseconds (loop) and milliseconds (cold start).
"""

import argparse
import json
import sys
import time

from jupyter_client.manager import KernelManager

TIMEOUT_S = 30.0


def percentile(sorted_values, p):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    rank = max(1, -(-len(sorted_values) * p // 100))  # ceil(n * p / 100)
    return sorted_values[int(rank) - 1]


def summary(values):
    values = sorted(values)
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "min": values[0],
        "max": values[-1],
        "mean": sum(values) / len(values),
    }


def vm_rss_kib(pid):
    with open("/proc/%d/status" % pid) as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS for pid %d" % pid)


def execute(client, code):
    """One round trip; returns the stdout the cell streamed on iopub."""
    msg_id = client.execute(code, store_history=True, allow_stdin=False)
    while True:
        msg = client.get_shell_msg(timeout=TIMEOUT_S)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_reply":
            if msg["content"]["status"] != "ok":
                raise RuntimeError("cell %r failed: %r" % (code, msg["content"]))
            break
    stdout = []
    while True:
        msg = client.get_iopub_msg(timeout=TIMEOUT_S)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "stream" and msg["content"]["name"] == "stdout":
            stdout.append(msg["content"]["text"])
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            return "".join(stdout)


def start():
    """Start a kernel; returns (manager, client, ms to ready, ms to first reply)."""
    t0 = time.perf_counter()
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel()
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    ready_ms = (time.perf_counter() - t0) * 1e3
    execute(client, "x=1")
    first_ms = (time.perf_counter() - t0) * 1e3
    return manager, client, ready_ms, first_ms


def stop(manager, client):
    client.stop_channels()
    manager.shutdown_kernel(now=True)


def timed_loop(client, code, count, expect_stdout):
    samples = []
    for _ in range(count):
        t0 = time.perf_counter_ns()
        out = execute(client, code)
        samples.append((time.perf_counter_ns() - t0) / 1e3)
        if out != expect_stdout:
            raise RuntimeError("cell %r printed %r, expected %r" % (code, out, expect_stdout))
    return samples


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--cold", type=int, default=3)
    args = parser.parse_args()

    ready, first = [], []
    for _ in range(max(1, args.cold) - 1):
        manager, client, ready_ms, first_ms = start()
        ready.append(ready_ms)
        first.append(first_ms)
        stop(manager, client)
    manager, client, ready_ms, first_ms = start()  # this one stays for the loop
    ready.append(ready_ms)
    first.append(first_ms)
    try:
        pid = manager.provisioner.process.pid
        rss_kib = vm_rss_kib(pid)
        timed_loop(client, "x=1", args.warmup, "")
        timed_loop(client, "print(1)", args.warmup, "1\n")
        x1 = timed_loop(client, "x=1", args.n, "")
        pr = timed_loop(client, "print(1)", args.n, "1\n")
    finally:
        stop(manager, client)

    import ipykernel
    import jupyter_client

    json.dump(
        {
            "versions": {
                "python": sys.version.split()[0],
                "jupyter_client": jupyter_client.__version__,
                "ipykernel": ipykernel.__version__,
            },
            "cold_start_ms": summary(ready),
            "cold_first_reply_ms": summary(first),
            "idle_rss_kib": rss_kib,
            "cells_us": {"x=1": summary(x1), "print(1)": summary(pr)},
        },
        sys.stdout,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
