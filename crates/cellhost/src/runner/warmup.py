# cellhost kernel runner, part 4 of 7 (compile.py, limits.py and helpers.py
# come first, frames.py, streams.py and runner.py last, in one shipped
# script): `--warmup`, the built-in warm-ups of preloaded modules. A pooled
# kernel (`[kernel] preload`) runs them after its imports and before its
# hello, so a session's first `pd.DataFrame(...)` or `plt.plot(...)` does
# not pay the lazy imports and caches behind a first frame, repr, HTML table
# or rendered figure (pandas' first frame, repr and HTML: ~35 ms in a fresh
# interpreter reading cold files, ~6 ms of the bench's first pandas cell).
# Then the heap is collected and frozen (gc.freeze): the GC never traverses
# again what the imports made. Builtin imports only.


def _warm_numpy(np):
    a = np.arange(3.0)
    repr(a)
    str(a)
    a.sum()
    a @ a


def _warm_pandas(pd):
    df = pd.DataFrame({"a": [1]})
    repr(df)
    df["a"].sum()
    repr(df["a"])
    _display_module().bundle(df)  # the first _repr_html_ and the display module


def _warm_pyplot(plt):
    fig, ax = plt.subplots()
    try:
        ax.plot([0, 1], [0, 1])
        ax.set_title("warm-up")
        _display_module()._figure_png(fig)
    finally:
        plt.close("all")


# Module name -> its warm-up, run when the preload imported that module.
_WARMUPS = (("numpy", _warm_numpy), ("pandas", _warm_pandas), ("matplotlib.pyplot", _warm_pyplot))


def _warm_up():
    """Pay the preloaded modules' first-call costs before the hello, in
    the pool rather than in a session's first cell: the lazy imports and
    caches behind a first frame and its repr and HTML table, a first
    array, a first rendered figure, and the display module's compile.
    Then collect and freeze the heap, so the GC never traverses what the
    imports made. Returns what failed (a warm-up never fails the pool)."""
    failed = []
    for name, warm in _WARMUPS:
        mod = _modules.get(name)  # preloaded, or imported by a preloaded one
        if mod is None:
            continue
        try:
            warm(mod)
        except BaseException as e:
            failed.append("warm-up of %s (%s: %s)" % (name, type(e).__name__, e))
    try:
        _display_module()
    except BaseException:
        pass
    import gc

    gc.collect()
    gc.freeze()
    return failed


