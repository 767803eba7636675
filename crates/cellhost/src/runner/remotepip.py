"""`%pip` on a remote kernel (ssh, docker, kubectl): pip runs here, on the
remote side, into the remote session's package dir (beside its
workspace, on sys.path), under the host's `[packages]` policy, which the
host wrote beside the workspace (`packages.json`). The same small grammar
as the host's (install / uninstall / list / show, a few flags, plain
requirement specifiers): never another index, a URL, a path or a
requirements file.
"""
import os
import re
import subprocess
import sys

USAGE = ("supported: `%pip install [-U] [--no-deps] [--pre] [-q] NAME[==VERSION]…`, "
         "`%pip uninstall NAME…`, `%pip list`, `%pip show NAME…`")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")
_VERSION = re.compile(r"^(==|>=|<=|~=|!=|>|<)[A-Za-z0-9.*+!-]+$")


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _glob(pattern, text):
    return re.fullmatch(".*".join(re.escape(p) for p in pattern.split("*")), text) is not None


def refused(name, policy):
    n = normalize(name)
    for p in policy.get("deny") or []:
        if _glob(normalize(p), n):
            return "`%s` is refused by the [packages] deny pattern %r in cellhost.toml" % (name, p)
    allow = policy.get("allow") or []
    if allow and not any(_glob(normalize(p), n) for p in allow):
        return "`%s` is not on the [packages] allow list (%s) in cellhost.toml" % (name, ", ".join(allow))
    return None


def check_spec(spec, policy):
    bad = ("%r is not a package name with an optional version (like `tabulate` or `tabulate==0.9`); "
           "URLs, paths and requirement files are not supported" % spec)
    m = _NAME.match(spec)
    if not m:
        raise ValueError(bad)
    name, tail = m.group(0), spec[m.end():]
    if tail.startswith("["):
        extras, sep, tail = tail[1:].partition("]")
        if not sep or not re.fullmatch(r"[A-Za-z0-9._,-]*", extras):
            raise ValueError(bad)
    for clause in [c for c in tail.split(",") if c]:
        if not _VERSION.match(clause):
            raise ValueError(bad)
    why = refused(name, policy)
    if why:
        raise ValueError(why)
    return name


def command(line, policy, target):
    """pip's argv after `python -m pip` (or the uninstaller's), checked."""
    words = [w.strip("\"'") for w in line.split()]
    words = [w for w in words if w]
    if not words:
        raise ValueError("`%pip` needs a command; " + USAGE)
    verb, rest = words[0], words[1:]
    if verb == "install":
        args = ["install", "--target", target, "--no-input", "--disable-pip-version-check",
                "--no-warn-script-location", "--progress-bar=off"]
        if policy.get("only_binary", True):
            args.append("--only-binary=:all:")
        if policy.get("index_url"):
            args += ["--index-url", policy["index_url"]]
        for u in policy.get("extra_index_urls") or []:
            args += ["--extra-index-url", u]
        specs = []
        for w in rest:
            if w in ("-U", "--upgrade"):
                args.append("--upgrade")
            elif w in ("--no-deps", "--pre"):
                args.append(w)
            elif w in ("-q", "--quiet"):
                args.append("-q")
            elif w in ("--user", "--no-cache-dir", "--upgrade-strategy=only-if-needed"):
                pass
            elif w.startswith(("--index-url", "-i", "--extra-index-url")):
                raise ValueError("`%s` is not allowed: the package index is set by the operator "
                                 "([packages] index_url in cellhost.toml)" % w)
            elif w.startswith("-"):
                raise ValueError("`%%pip install %s` is not supported; %s" % (w, USAGE))
            else:
                check_spec(w, policy)
                specs.append(w)
        if not specs:
            raise ValueError("`%pip install` needs at least one package name; " + USAGE)
        return "pip", args + specs
    if verb == "uninstall":
        names = [w for w in rest if w not in ("-y", "--yes")]
        if not names or any(not _NAME.fullmatch(n) for n in names):
            raise ValueError("`%pip uninstall` takes package names; " + USAGE)
        return "uninstall", names
    if verb in ("list", "freeze") and not rest:
        return "pip", ["list", "--path", target, "--disable-pip-version-check"]
    if verb == "show" and rest:
        if any(not _NAME.fullmatch(n) for n in rest):
            raise ValueError("`%pip show` takes package names; " + USAGE)
        return "pip", ["show", "--disable-pip-version-check"] + rest
    raise ValueError("`%%pip %s` is not supported; %s" % (verb, USAGE))


def _dir_bytes(d):
    total = 0
    for root, dirs, files in os.walk(d):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def run(line, policy, target, uninstaller, error):
    """Run `%pip line`; pip's output streams into the cell. Returns pip's
    status; raises `error` when refused or failed."""
    if not policy.get("enabled", True):
        raise error("`%pip` is turned off on this host ([packages] enabled = false in cellhost.toml)")
    try:
        kind, args = command(line, policy, target)
    except ValueError as e:
        raise error(str(e)) from None
    os.makedirs(target, 0o755, exist_ok=True)
    cap = (policy.get("max_mib") or 0) << 20
    before = set(os.listdir(target))
    if cap and args[0] == "install" and _dir_bytes(target) >= cap:
        raise error("this session's packages are at the [packages] max_mib cap of %d MiB" % (cap >> 20))
    if kind == "pip":
        argv = [sys.executable, "-s", "-m", "pip"] + args
    else:
        argv = [sys.executable, "-s", "-c", uninstaller, target] + args
    env = dict(os.environ, PYTHONPATH=target, PYTHONUNBUFFERED="1", PYTHONNOUSERSITE="1")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    tail = []
    try:
        for raw in iter(p.stdout.readline, b""):
            text = raw.decode("utf-8", "replace")
            sys.stdout.write(text)
            sys.stdout.flush()
            tail = (tail + [text.rstrip("\n")])[-15:]
        status = p.wait(timeout=policy.get("timeout_seconds") or None)
    except BaseException:
        p.kill()
        p.wait()
        raise
    if status != 0:
        msg = "pip %s failed (exit status %d):\n%s" % (args[0] if kind == "pip" else "uninstall", status, "\n".join(tail))
        if policy.get("only_binary", True) and "satisfies the requirement" in msg:
            msg += ("\nnote: [packages] only_binary = true in cellhost.toml allows wheels only (no package "
                    "code runs at install time); a package published only as a source distribution cannot be installed here")
        raise error(msg)
    if cap and args[0] == "install" and _dir_bytes(target) > cap:
        import shutil

        for n in set(os.listdir(target)) - before:
            p = os.path.join(target, n)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)
        raise error("the install would take this session's packages over the [packages] max_mib cap of %d MiB; "
                    "what it added was removed" % (cap >> 20))
    return status
