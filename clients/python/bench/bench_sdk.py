"""SDK overhead: a warm `Session.run("x=1")` against a bare `http.client`
request with the same body on a kept-alive connection, interleaved, in the
same run, against one daemon (scripts/bench-sdk starts it).

    python bench_sdk.py URL [N]   -> prints p50/p99 of both and the difference
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import time
import urllib.parse

from cellhost import Client


def main() -> None:
    url = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    parsed = urllib.parse.urlsplit(url)
    body = json.dumps({"code": "x=1"}).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    raw = http.client.HTTPConnection(parsed.hostname, parsed.port)
    client = Client(url)
    sdk_session = client.session("bench-sdk")
    path = "/v1/sessions/bench-raw/execute"

    def bare() -> None:
        raw.request("POST", path, body=body, headers=headers)
        resp = raw.getresponse()
        json.loads(resp.read())

    def sdk() -> None:
        sdk_session.run("x=1")

    for _ in range(200):  # warm both kernels and connections
        bare()
        sdk()
    times: dict[str, list[float]] = {"bare": [], "sdk": []}
    for i in range(n):
        order = (("bare", bare), ("sdk", sdk)) if i % 2 == 0 else (("sdk", sdk), ("bare", bare))
        for name, fn in order:
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)

    def q(xs: list[float], p: float) -> float:
        return sorted(xs)[int(p * (len(xs) - 1))] * 1e6

    b50, s50 = statistics.median(times["bare"]) * 1e6, statistics.median(times["sdk"]) * 1e6
    print(
        json.dumps(
            {
                "n": n,
                "bare_http_client_us": {
                    "p50": round(b50, 1),
                    "p99": round(q(times["bare"], 0.99), 1),
                },
                "sdk_us": {"p50": round(s50, 1), "p99": round(q(times["sdk"], 0.99), 1)},
                "sdk_overhead_p50_us": round(s50 - b50, 1),
                "ratio_p50": round(s50 / b50, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
