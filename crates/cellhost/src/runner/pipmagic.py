# cellhost kernel runner: `%pip` (and `!pip`, `!python -m pip`), called by
# magics.py with the argument line, `{expr}`/`$name` already expanded.
# Stdlib only, Python >= 3.8.
#
# The interface is `pip_magic(line: str) -> int` (pip's exit status, kept
# in `_exit_code`). This version runs pip inside the kernel; a host-side
# install replaces it.


def pip_magic(line):
    import importlib
    import shlex
    import subprocess
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    # Output straight to the cell's fds: live, captured like any
    # subprocess's.
    rc = subprocess.call([sys.executable, "-m", "pip"] + shlex.split(line), stdin=subprocess.DEVNULL)
    importlib.invalidate_caches()
    return rc
