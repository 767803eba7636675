# cellhost kernel runner: one sentence that says what to do about a cell's
# error, sent as the reply's `hint` (the result's `hint` field, shown by
# the MCP and CLI renderings). Stdlib only, Python >= 3.8; loaded on the
# first error. `hint(exc, network)` never raises; `network` is the
# kernel's network mode as the host passed it (`--network=`): "off",
# "allowlist", "host", or None when unknown (remote kernels).
#
# - ModuleNotFoundError for a missing top-level module: how to install it
#   (the distribution's name for the import names that differ).
# - A name-resolution or connection failure in a kernel without the host's
#   network: the network mode and how to change it.
# - A SyntaxError on a line starting with `!` or `%`: the supported set.

import sys

# Import name -> distribution name, where they differ (the common cases).
DISTRIBUTIONS = {
    "sklearn": "scikit-learn",
    "cv2": "opencv-python",
    "PIL": "pillow",
    "yaml": "pyyaml",
    "bs4": "beautifulsoup4",
    "skimage": "scikit-image",
    "dateutil": "python-dateutil",
    "dotenv": "python-dotenv",
    "Crypto": "pycryptodome",
    "docx": "python-docx",
    "pptx": "python-pptx",
    "jwt": "pyjwt",
    "magic": "python-magic",
    "serial": "pyserial",
    "usb": "pyusb",
    "google.protobuf": "protobuf",
    "attr": "attrs",
    "fitz": "pymupdf",
    "Levenshtein": "python-levenshtein",
    "OpenSSL": "pyopenssl",
    "mpl_toolkits": "matplotlib",
}

# Words of errors that mean "no network here", for exceptions that carry
# them only as text (libraries that wrap without chaining).
_NETWORK_WORDS = (
    "Temporary failure in name resolution",
    "Name or service not known",
    "No address associated with hostname",
    "nodename nor servname provided",
    "Network is unreachable",
    "Failed to resolve",
    "NameResolutionError",
    "getaddrinfo failed",
    "Failed to establish a new connection",
)
_NET_ERRNOS = frozenset((101, 113, 111, 99))  # ENETUNREACH EHOSTUNREACH ECONNREFUSED EADDRNOTAVAIL


def _chain(exc):
    """`exc` and the exceptions it was raised from or during, and the
    exceptions in their args or `reason` (urllib's URLError)."""
    seen = []
    todo = [exc]
    while todo and len(seen) < 20:
        e = todo.pop()
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo.append(getattr(e, "__cause__", None))
        todo.append(getattr(e, "__context__", None))
        reason = getattr(e, "reason", None)
        if isinstance(reason, BaseException):
            todo.append(reason)
        for a in getattr(e, "args", ())[:3]:
            if isinstance(a, BaseException):
                todo.append(a)
    return seen


def _is_network_failure(exc):
    import socket

    for e in _chain(exc):
        if isinstance(e, socket.gaierror):
            return True
        if isinstance(e, OSError) and e.errno in _NET_ERRNOS:
            return True
    try:
        text = "%s" % (exc,)
    except Exception:
        return False
    return any(w in text for w in _NETWORK_WORDS)


def network_hint(mode):
    """The sentence for a network failure in a kernel of network `mode`."""
    if mode == "allowlist":
        return (
            "this kernel reaches the network only through cellhost's allow-list proxy (sandbox "
            "network mode \"allowlist\"), and this host is not on it; packages install with "
            "`%pip install NAME`; the operator can add hosts to `[sandbox] allow_hosts` in "
            "cellhost.toml"
        )
    return (
        "this kernel has no network (sandbox network mode \"%s\"): names do not resolve and "
        "connections fail; packages install with `%%pip install NAME`; for other access the "
        "operator sets `[sandbox] network` in cellhost.toml" % mode
    )


def module_hint(exc):
    name = getattr(exc, "name", None)
    if not isinstance(name, str) or not name:
        return None
    top = name.split(".")[0]
    if top in sys.modules:
        return None  # the package is there; a submodule of it is not
    try:
        import importlib.util

        if importlib.util.find_spec(top) is not None:
            return None
    except Exception:
        pass
    dist = DISTRIBUTIONS.get(name) or DISTRIBUTIONS.get(top) or top
    return "install it with `%%pip install %s`; packages persist for this session" % dist


def syntax_hint(exc):
    line = getattr(exc, "text", None) or ""
    if line.lstrip()[:1] not in ("!", "%"):
        return None
    try:
        supported = _runtime.load("dialect").SUPPORTED
    except Exception:
        return None
    return (
        "`!` and `%` escapes work at the start of a statement (not inside brackets or after "
        "`:` on one line); cellhost supports " + supported
    )


def hint(exc, network):
    try:
        if isinstance(exc, ModuleNotFoundError):
            return module_hint(exc)
        if isinstance(exc, SyntaxError):
            return syntax_hint(exc)
        if network in ("off", "allowlist") and _is_network_failure(exc):
            return network_hint(network)
    except Exception:
        pass
    return None
