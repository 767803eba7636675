# `%pip uninstall NAME…` for a `pip install --target` dir (pip itself
# cannot uninstall from one): run as `python -c SOURCE DIR NAME…`. Each
# NAME's `*.dist-info/RECORD` lists its files; those inside DIR are
# removed (never through a symlink, never outside DIR), then the emptied
# directories and the dist-info. Prints what it removed; exit status 1
# when a name is not installed there.
import os
import re
import shutil
import sys


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def main():
    target = os.path.realpath(sys.argv[1])
    status = 0
    for want in sys.argv[2:]:
        dists = []
        try:
            names = os.listdir(target)
        except OSError:
            names = []
        for n in names:
            if n.endswith(".dist-info") and norm(n[: -len(".dist-info")].rsplit("-", 1)[0]) == norm(want):
                dists.append(n)
        if not dists:
            print("WARNING: Skipping %s as it is not installed in this session." % want, flush=True)
            status = 1
            continue
        for dist in dists:
            info = os.path.join(target, dist)
            files, dirs = [], set()
            try:
                with open(os.path.join(info, "RECORD"), encoding="utf-8") as f:
                    for line in f:
                        path = line.rsplit(",", 2)[0].strip()
                        if path:
                            files.append(path)
            except OSError:
                pass
            removed = 0
            for rel in files:
                full = os.path.normpath(os.path.join(target, rel))
                if not full.startswith(target + os.sep):
                    continue
                # Never through a symlinked directory.
                parent = os.path.dirname(full)
                if os.path.realpath(parent) != parent:
                    continue
                try:
                    os.unlink(full)
                    removed += 1
                except OSError:
                    continue
                d = parent
                while d != target and d.startswith(target + os.sep):
                    dirs.add(d)
                    d = os.path.dirname(d)
            for d in sorted(dirs, key=len, reverse=True):
                for junk in ("__pycache__",):
                    p = os.path.join(d, junk)
                    if os.path.isdir(p) and not os.path.islink(p):
                        shutil.rmtree(p, ignore_errors=True)
                try:
                    os.rmdir(d)
                except OSError:
                    pass
            if os.path.isdir(info) and not os.path.islink(info):
                shutil.rmtree(info, ignore_errors=True)
            print("Successfully uninstalled %s (%d files)" % (dist[: -len(".dist-info")], removed), flush=True)
    sys.exit(status)


main()
