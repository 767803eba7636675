# cellhost rich outputs: display(), rich last values and matplotlib figures.
#
# Read by runner.py from the kernel's staging dir at start, compiled on first use:
# the first display() call, the first last-expression value with a rich
# repr, or the first `import matplotlib`. A kernel that never shows
# anything never pays for this file. Stdlib only.
#
# A display is a bundle of (mime, data) items. Text mimes travel as UTF-8,
# images as raw bytes; the host base64-encodes binary data. Each display is
# sent at once, as its own frame on the reply pipe (see frames.py `_send`),
# so displays from threads and long cells arrive while the cell runs.

import os
import sys

rt = None  # the runner module's hooks, set by init()

# IPython's formatter methods, in the order the items are listed.
_FORMATTERS = (
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
)
_ORDER = {mime: i for i, (_, mime) in enumerate(_FORMATTERS)}

_lock = None
_cell_bytes = 0
_cell_count = 0
_dropped = 0
_drop_note = None
_shown_figures = []  # figures displayed this cell: not captured again at its end


def init(runtime):
    global rt, _lock
    rt = runtime
    _lock = runtime._thread.allocate_lock()


def begin_cell():
    global _cell_bytes, _cell_count
    with _lock:
        _cell_bytes = 0
        _cell_count = 0
    del _shown_figures[:]


def take_drops():
    """(count, first reason) of displays dropped since the last call."""
    global _dropped, _drop_note
    with _lock:
        out = (_dropped, _drop_note)
        _dropped = 0
        _drop_note = None
    return out


def _is_text(mime):
    return mime.startswith("text/") or mime.endswith(("+xml", "json")) or mime == "application/javascript"


def _human(n):
    if n >= 1 << 20:
        return "%.1f MiB" % (n / float(1 << 20))
    if n >= 1 << 10:
        return "%.1f KiB" % (n / 1024.0)
    return "%d bytes" % n


def _warn(what, err):
    try:
        sys.stderr.write("display: %s raised %s: %s; skipped\n" % (what, type(err).__name__, err))
    except Exception:
        pass


def _as_bytes(mime, data):
    """Item data as bytes to send, or None when it cannot be used."""
    if isinstance(data, tuple) and len(data) == 2:  # (data, metadata)
        data = data[0]
    if data is None:
        return None
    if _is_text(mime):
        if isinstance(data, str):
            return data.encode("utf-8", "surrogateescape")
        if isinstance(data, (bytes, bytearray, memoryview)):
            return bytes(data)
        if mime.endswith("json"):
            import json

            return json.dumps(data, default=repr).encode()
        return str(data).encode("utf-8", "surrogateescape")
    if isinstance(data, str):  # base64 text, as Jupyter bundles carry images
        import binascii

        try:
            return binascii.a2b_base64(data.encode("ascii"))
        except (binascii.Error, UnicodeError):
            return None
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    return None


def _figure_png(fig):
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _pil_png(img):
    import io

    buf = io.BytesIO()
    try:
        img.save(buf, format="PNG")
    except Exception:
        buf = io.BytesIO()
        img.convert("RGBA").save(buf, format="PNG")
    return buf.getvalue()


def _special(obj):
    """(mime, bytes) for types that have no _repr_png_ of their own."""
    mod = sys.modules.get("matplotlib.figure")
    if mod is not None and isinstance(obj, getattr(mod, "Figure", ())):
        _shown_figures.append(obj)
        return "image/png", _figure_png(obj)
    mod = sys.modules.get("PIL.Image")
    if mod is not None and isinstance(obj, getattr(mod, "Image", ())):
        return "image/png", _pil_png(obj)
    return None


def bundle(obj, include=None, exclude=None, text=None):
    """The display bundle of `obj`: [(mime, bytes)], text/plain last.
    `text`: repr(obj), when the caller has it already."""
    data = {}
    cls = type(obj)
    try:
        special = _special(obj)
    except Exception as e:
        _warn("rendering %s" % cls.__name__, e)
        special = None
    if special is not None:
        data[special[0]] = special[1]
    else:
        # Looked up on the type, as IPython does, so objects that answer
        # every attribute (mocks, proxies) are not mistaken for rich ones.
        if getattr(cls, "_repr_mimebundle_", None) is not None:
            try:
                got = obj._repr_mimebundle_(include=include, exclude=exclude)
                if isinstance(got, tuple):
                    got = got[0]
                for mime, value in (got or {}).items():
                    value = _as_bytes(mime, value)
                    if value is not None:
                        data[mime] = value
            except Exception as e:
                _warn("%s._repr_mimebundle_" % cls.__name__, e)
        for method, mime in _FORMATTERS:
            if mime in data or getattr(cls, method, None) is None:
                continue
            try:
                value = _as_bytes(mime, getattr(obj, method)())
            except Exception as e:
                _warn("%s.%s" % (cls.__name__, method), e)
                continue
            if value is not None:
                data[mime] = value
    # One raster image is enough (PIL answers both PNG and JPEG).
    if "image/png" in data:
        data.pop("image/jpeg", None)
    if "text/plain" not in data:
        try:
            if text is None:
                text = repr(obj)
        except Exception as e:
            text = "<%s object (repr raised %s)>" % (cls.__name__, type(e).__name__)
        data["text/plain"] = text.encode("utf-8", "surrogateescape")
    if include:
        data = {m: v for m, v in data.items() if m in include}
    if exclude:
        data = {m: v for m, v in data.items() if m not in exclude}
    return sorted(data.items(), key=lambda kv: _ORDER.get(kv[0], len(_ORDER)) if kv[0] != "text/plain" else 99)


def publish(items, is_value=False):
    """Send one display (or count it dropped). True when it was sent.
    `is_value`: it is the cell's last value (the host marks it value_display)."""
    global _cell_bytes, _cell_count, _dropped, _drop_note
    if not items:
        return False
    size = 0
    for _, value in items:
        size += len(value)
    what = ", ".join(m for m, _ in items if m != "text/plain") or "text/plain"
    with _lock:
        reason = None
        if size > rt.MAX_DISPLAY:
            reason = "a display (%s) of %s is over the per-display cap of %s" % (
                what,
                _human(size),
                _human(rt.MAX_DISPLAY),
            )
        elif _cell_count >= rt.MAX_CELL_DISPLAYS:
            reason = "the cell reached its cap of %d displays" % rt.MAX_CELL_DISPLAYS
        elif _cell_bytes + size > rt.MAX_CELL_BYTES:
            reason = "the cell's displays reached the per-cell cap of %s" % _human(rt.MAX_CELL_BYTES)
        if reason is not None:
            _dropped += 1
            if _drop_note is None:
                _drop_note = reason
            return False
        _cell_bytes += size
        _cell_count += 1
    fields = {"op": "display"}
    if is_value:
        fields["value"] = b"1"
    for i, (mime, value) in enumerate(items):
        fields["m%d" % i] = mime
        fields["d%d" % i] = value
    rt._order()  # a watched cell's earlier prints go first (frames.py)
    return rt._send(rt._encode(fields))


def display(*objs, include=None, exclude=None, raw=False, **_ignored):
    """Show objects as rich outputs in the cell's result (IPython's display).

    Each object becomes one display: its richest representations (PNG,
    JPEG, SVG, HTML, Markdown, LaTeX, JSON through the `_repr_*_` methods
    or `_repr_mimebundle_`; matplotlib figures and PIL images as PNG) plus
    a text/plain fallback. With raw=True each object is a {mime: data}
    dict sent as is.
    """
    for obj in objs:
        if raw and isinstance(obj, dict):
            items = []
            for mime, value in obj.items():
                value = _as_bytes(str(mime), value)
                if value is not None:
                    items.append((str(mime), value))
        else:
            items = bundle(obj, include, exclude)
        publish(items)


def show_value(value, text=None):
    """The cell's last value: a display too when it has a rich repr.
    `text`: its repr, made already for the reply."""
    items = bundle(value, text=text)
    if len(items) > 1 or items[0][0] != "text/plain":
        publish(items, is_value=True)


def flush_figures():
    """Every open matplotlib figure becomes a PNG display, then all close."""
    plt = sys.modules.get("matplotlib.pyplot")
    helpers = sys.modules.get("matplotlib._pylab_helpers")
    if plt is None or helpers is None:
        return
    managers = helpers.Gcf.get_all_fig_managers()
    if not managers:
        del _shown_figures[:]
        return
    try:
        for manager in managers:
            fig = manager.canvas.figure
            if any(fig is shown for shown in _shown_figures):
                continue
            try:
                png = _figure_png(fig)
            except Exception as e:
                _warn("rendering figure %s" % (manager.num,), e)
                continue
            try:
                text = repr(fig)
            except Exception:
                text = "<Figure>"
            publish([("image/png", png), ("text/plain", text.encode())])
    finally:
        del _shown_figures[:]
        plt.close("all")


def patch_pyplot(plt):
    """plt.show() captures and closes the open figures, as Jupyter's inline backend does."""
    if getattr(plt.show, "_cellhost", False):
        return

    def show(*args, **kwargs):
        """Capture every open figure as a PNG display in the cell's result, then close them."""
        flush_figures()

    show._cellhost = True
    show.__wrapped__ = plt.show
    plt.show = show


def find_spec(name, path, target, hook):
    """The spec of `matplotlib` or `matplotlib.pyplot`, found by the other
    finders, with a loader that prepares the module (runner.py's hook).

    `matplotlib` is executed with MPLBACKEND=Agg unless the environment
    sets a backend, so no window ever opens; the variable is removed again,
    so the kernel's environment stays the allow-listed one. In
    `matplotlib.pyplot`, show() is patched to capture figures.
    """
    for finder in sys.meta_path:
        if finder is hook or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(name, path, target)
        if spec is not None:
            break
    else:
        return None
    exec_module = getattr(spec.loader, "exec_module", None)
    if exec_module is None:
        return spec

    if name == "matplotlib":

        def patched(module):
            environ = os.environ
            own = "MPLBACKEND" not in environ
            if own:
                environ["MPLBACKEND"] = "Agg"
            try:
                exec_module(module)
            finally:
                if own:
                    environ.pop("MPLBACKEND", None)

    else:

        def patched(module):
            exec_module(module)
            try:
                patch_pyplot(module)
            except Exception as e:
                _warn("patching plt.show", e)

    spec.loader.exec_module = patched
    return spec
