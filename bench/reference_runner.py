"""The raw-pipe reference: the smallest persistent Python runner that still
does a cell's job. It is the physical floor cellhost is measured against.

Protocol, over two plain pipes (the child's stdin carries requests, a
duplicate of its original stdout carries replies): every message is a 4-byte
big-endian length followed by that many bytes of UTF-8 JSON.

    request: {"code": "..."}
    reply:   {"ok": true, "stdout": "..."}  or  {"ok": false, "error": "..."}

Each cell runs as exec(compile(code)) in one persistent namespace. print()
output is captured in memory (io.StringIO) and handed back in the reply;
fd 1 itself points at /dev/null so nothing can corrupt the reply stream.
Stdlib only; exits when its request pipe closes.
"""

import io
import json
import os
import struct
import sys

_HEADER = struct.Struct(">I")


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main():
    requests = 0
    replies = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)

    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    real_stdout = sys.stdout
    pending = bytearray()
    while True:
        # Buffered framing: one read() usually holds a whole request.
        while len(pending) < 4 or len(pending) < 4 + _HEADER.unpack_from(pending)[0]:
            chunk = os.read(requests, 65536)
            if not chunk:
                return
            pending += chunk
        (length,) = _HEADER.unpack_from(pending)
        request = json.loads(pending[4 : 4 + length])
        del pending[: 4 + length]

        captured = io.StringIO()
        sys.stdout = captured
        try:
            exec(compile(request["code"], "<cell>", "exec"), namespace)
            reply = {"ok": True, "stdout": captured.getvalue()}
        except BaseException as exc:  # noqa: BLE001 - a cell never ends the runner
            reply = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
        finally:
            sys.stdout = real_stdout
        body = json.dumps(reply).encode()
        _write_all(replies, _HEADER.pack(len(body)) + body)


if __name__ == "__main__":
    main()
