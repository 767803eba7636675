# cellhost kernel runner, part 2 of 7: resource limits seen from inside the
# kernel (the per-cell CPU limit, and which limit an exception means). The
# host joins compile.py, this file, helpers.py, warmup.py, frames.py,
# streams.py and runner.py into one script; the globals used here
# (_cpu_per_cell, _sources…) are defined in runner.py.


def _limit_cpu():
    # At the start of every cell: soft RLIMIT_CPU = CPU used so far + the
    # per-cell allowance. process_time() is the same clock RLIMIT_CPU
    # counts and far cheaper than getrusage(); setrlimit runs only when
    # the whole-second value moves, so a warm trivial cell pays ~1 us.
    global _cpu_hard, _cpu_soft, _resource
    soft = int(_process_time()) + 1 + _cpu_per_cell
    if soft == _cpu_soft:
        return
    if _resource is None:
        import resource as _resource

        _cpu_hard = _resource.getrlimit(_resource.RLIMIT_CPU)[1]
    if _cpu_hard != _resource.RLIM_INFINITY:
        soft = min(soft, _cpu_hard)
    _resource.setrlimit(_resource.RLIMIT_CPU, (soft, _cpu_hard))
    _cpu_soft = soft


def _breach_of(e):
    # Exceptions that mean a resource limit was hit; the host decides
    # whether the limit is one of ours and names it.
    if isinstance(e, MemoryError):
        return "memory"
    if isinstance(e, OSError):
        err = e.errno
        if err == 27:  # EFBIG
            return "file_size"
        if err == 24:  # EMFILE
            return "open_files"
        if err == 11 and _from_fork(e):  # EAGAIN from a refused fork
            return "processes"
    return None


# Where a refused fork surfaces: the stdlib's fork callers, or a line of
# the cell that forks itself. EAGAIN elsewhere (a non-blocking read) is not
# the process limit.
_FORK_CALLERS = frozenset(("_execute_child", "_launch", "_fork_exec", "_spawnvef"))
_FORK_WORDS = ("fork", "spawn", "Popen", "subprocess", "system(", "Pool(", "Process(")


def _from_fork(e):
    try:
        return _fork_in_traceback(e)
    except Exception:  # at a limit, looking may fail too: claim nothing
        return False


def _fork_in_traceback(e):
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    if code.co_name in _FORK_CALLERS:
        return True
    import linecache

    _sync_linecache()
    line = linecache.getline(code.co_filename, tb.tb_lineno)
    return any(w in line for w in _FORK_WORDS)


