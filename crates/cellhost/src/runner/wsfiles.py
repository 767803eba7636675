# Workspace files on a remote backend: run by the host over the backend's
# exec transport (ssh, docker exec -i, kubectl exec -i) as
#   python3 -c SOURCE OP BASE KEY REL [ARGS...]
# where BASE is the configured tmpdir ("" = the remote temp dir), KEY the
# session's workspace under "cellhost-ws-<uid>/" and REL a path the host
# already checked (checked again here). File contents only ever travel on
# stdin/stdout, never in argv.
#
# The workspace is written by agent code, so every name in it is hostile:
# each component is opened with openat(dir_fd, name, O_NOFOLLOW) (no
# symlink is followed anywhere, `..` is refused), files are opened
# O_NONBLOCK and checked with fstat before a byte is read (a FIFO never
# blocks, FIFOs/sockets/devices are refused).
#
# `spill` writes the full text of a cut stream (on stdin) under
# .cellhost/output/ and keeps the newest N spill files there.
#
# Answers: the last stdout line `OK <json>` or `ERR <code> <message>`;
# `read` prints `OK <json>\n` and then the bytes.
import errno
import json
import os
import stat
import sys
import tempfile

D = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
CHUNK = 256 * 1024


class Refused(Exception):
    def __init__(self, code, message):
        Exception.__init__(self, message)
        self.code = code


def out(line):
    sys.stdout.buffer.write(line.encode("utf-8", "backslashreplace") + b"\n")
    sys.stdout.buffer.flush()


def parts_of(rel):
    if "\0" in rel:
        raise Refused("invalid_path", "the path contains NUL")
    parts = [p for p in rel.split("/") if p]
    for p in parts:
        if p in (".", ".."):
            raise Refused("invalid_path", "`.` and `..` are not allowed")
    return parts


def mkdir_open(fd, name, mode):
    try:
        os.mkdir(name, mode, dir_fd=fd)
    except FileExistsError:
        pass
    return os.open(name, D, dir_fd=fd)


def base_fd(base, make):
    # <base>/cellhost-ws-<uid>: ours alone (0700, owned by us), so no other
    # user of a shared /tmp can plant anything in it.
    base = base or tempfile.gettempdir()
    top = "cellhost-ws-%d" % os.geteuid()
    bfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if make:
            fd = mkdir_open(bfd, top, 0o700)
        else:
            fd = os.open(top, D, dir_fd=bfd)
    finally:
        os.close(bfd)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise Refused("io", "%s/%s is not a private directory of this user" % (base, top))
    return fd, os.path.join(base, top)


def root_fd(base, key, make):
    """The workspace root's fd, or None when it was never made."""
    try:
        fd, path = base_fd(base, make)
    except FileNotFoundError:
        return None, None
    for i, part in enumerate(key.split("/")):
        try:
            nfd = mkdir_open(fd, part, 0o700 if i < len(key.split("/")) - 1 else 0o755) if make else os.open(part, D, dir_fd=fd)
        except FileNotFoundError:
            os.close(fd)
            return None, None
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused("io", "the workspace directory is not a directory")
            raise
        os.close(fd)
        fd = nfd
        path = os.path.join(path, part)
    return fd, path


def resolve_error(e):
    if e.errno == errno.ENOENT:
        return Refused("not_found", "")
    if e.errno == errno.ELOOP:
        return Refused("invalid_path", "the path is or passes through a symlink")
    if e.errno == errno.ENOTDIR:
        return Refused("not_a_directory", "")
    if e.errno == errno.ENAMETOOLONG:
        return Refused("invalid_path", "a name is too long")
    return e


def walk(fd, parts, make=False):
    """Open the directory at `parts` beneath fd (fd is kept)."""
    cur = os.dup(fd)
    try:
        for p in parts:
            try:
                if make:
                    try:
                        os.mkdir(p, 0o755, dir_fd=cur)
                        nfd = os.open(p, D, dir_fd=cur)
                        os.fchmod(nfd, 0o755)
                    except FileExistsError:
                        nfd = os.open(p, D, dir_fd=cur)
                else:
                    nfd = os.open(p, D, dir_fd=cur)
            except OSError as e:
                if e.errno == errno.ELOOP or (e.errno == errno.ENOTDIR and is_link(cur, p)):
                    raise Refused("invalid_path", "the path is or passes through a symlink")
                raise resolve_error(e)
            os.close(cur)
            cur = nfd
        return cur
    except BaseException:
        os.close(cur)
        raise


def is_link(fd, name):
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=fd).st_mode)
    except OSError:
        return False


def kind(st):
    m = st.st_mode
    if stat.S_ISREG(m):
        return "file"
    if stat.S_ISDIR(m):
        return "dir"
    if stat.S_ISLNK(m):
        return "symlink"
    return "other"


def mtime(st):
    return st.st_mtime_ns / 1e9


def etag(st):
    return '"%x-%x-%x"' % (st.st_ino, st.st_size, st.st_mtime_ns)


def open_file(root, parts):
    """(fd, stat) of a regular file, or (None, stat) of a directory."""
    if not parts:
        return None, os.fstat(root)
    d = walk(root, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0), dir_fd=d)
        except OSError as e:
            if e.errno in (errno.ENXIO, errno.EOPNOTSUPP):
                raise Refused("not_a_regular_file", "")
            raise resolve_error(e)
    finally:
        os.close(d)
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        os.close(fd)
        return None, st
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise Refused("not_a_regular_file", "")
    return fd, st


def usage(fd, depth=0):
    total = 0
    try:
        names = os.listdir(fd)
    except OSError:
        return 0
    for n in names:
        try:
            st = os.lstat(n, dir_fd=fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
        elif stat.S_ISDIR(st.st_mode) and depth < 256:
            try:
                sub = os.open(n, D, dir_fd=fd)
            except OSError:
                continue
            try:
                total += usage(sub, depth + 1)
            finally:
                os.close(sub)
    return total


def read_exact(n):
    buf = b""
    while len(buf) < n:
        b = sys.stdin.buffer.read(n - len(buf))
        if not b:
            return None
        buf += b
    return buf


def op_write(root, parts, max_bytes, quota):
    # stdin: frames of <4-byte big-endian length><bytes>, ended by a
    # zero-length frame. Without it (the host gave up, the connection
    # dropped) the temporary file is removed and nothing is replaced.
    if not parts:
        raise Refused("is_a_directory", "the workspace root")
    d = walk(root, parts[:-1], make=True)
    name = parts[-1]
    tmp = ".cellhost-upload-%s" % os.urandom(8).hex()
    try:
        existing, old = False, 0
        try:
            st = os.lstat(name, dir_fd=d)
            existing = True
            if stat.S_ISDIR(st.st_mode):
                raise Refused("is_a_directory", "")
            if stat.S_ISREG(st.st_mode):
                old = st.st_size
        except FileNotFoundError:
            pass
        left = None
        if quota:
            used = max(usage(root) - old, 0)
            if used >= quota:
                raise Refused("quota_exceeded", "%d %d" % (quota, used))
            left = quota - used
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=d)
        done = False
        try:
            os.fchmod(fd, 0o644)
            size = 0
            while True:
                head = read_exact(4)
                if head is None:
                    raise Refused("bad_body", "the upload was cut off")
                n = int.from_bytes(head, "big")
                if n == 0:
                    break
                data = read_exact(n)
                if data is None:
                    raise Refused("bad_body", "the upload was cut off")
                size += n
                if max_bytes and size > max_bytes:
                    raise Refused("too_large", str(max_bytes))
                if left is not None and size > left:
                    raise Refused("quota_exceeded", "%d %d" % (quota, quota - left))
                v = memoryview(data)
                while v:
                    v = v[os.write(fd, v):]
            os.close(fd)
            fd = None
            try:
                os.rename(tmp, name, src_dir_fd=d, dst_dir_fd=d)
            except IsADirectoryError:
                raise Refused("is_a_directory", "")
            done = True
            out("OK " + json.dumps({"size": size, "created": not existing}))
        finally:
            if fd is not None:
                os.close(fd)
            if not done:
                try:
                    os.unlink(tmp, dir_fd=d)
                except OSError:
                    pass
    finally:
        os.close(d)


def op_read(root, parts, start, length):
    fd, st = open_file(root, parts)
    if fd is None:
        raise Refused("is_a_directory", "")
    try:
        os.set_blocking(fd, True)
        if length < 0:
            length = st.st_size - start
        os.lseek(fd, start, os.SEEK_SET)
        out("OK " + json.dumps({"size": st.st_size, "etag": etag(st)}))
        w = sys.stdout.buffer
        while length > 0:
            b = os.read(fd, min(CHUNK, length))
            if not b:
                break
            w.write(b)
            length -= len(b)
        w.flush()
    finally:
        os.close(fd)


def op_stat(root, parts):
    fd, st = open_file(root, parts)
    if fd is not None:
        os.close(fd)
        out("OK " + json.dumps({"kind": "file", "size": st.st_size, "modified": mtime(st), "etag": etag(st)}))
    else:
        out("OK " + json.dumps({"kind": "dir"}))


def op_list(root, parts, recursive, limit):
    entries, truncated = [], False
    queue = [parts]
    first = True
    while queue:
        dparts = queue.pop(0)
        try:
            d = walk(root, dparts)
        except Refused:
            if first:
                raise
            continue
        first = False
        try:
            names = sorted(os.listdir(d))
            for n in names:
                if len(entries) >= limit:
                    truncated = True
                    break
                try:
                    st = os.lstat(n, dir_fd=d)
                except OSError:
                    continue
                k = kind(st)
                child = dparts + [n]
                if recursive and k == "dir":
                    queue.append(child)
                entries.append({"name": n, "path": "/".join(child), "type": k,
                                "size": 0 if k == "dir" else st.st_size, "modified": mtime(st)})
        finally:
            os.close(d)
        if truncated or (len(entries) >= limit and queue):
            truncated = True
            break
    out("OK " + json.dumps({"entries": entries, "truncated": truncated}))


def remove_tree(d, depth=0):
    for n in os.listdir(d):
        st = os.lstat(n, dir_fd=d)
        if stat.S_ISDIR(st.st_mode) and depth < 256:
            sub = os.open(n, D, dir_fd=d)
            try:
                remove_tree(sub, depth + 1)
            finally:
                os.close(sub)
            os.rmdir(n, dir_fd=d)
        else:
            os.unlink(n, dir_fd=d)


def op_rm(root, parts, recursive):
    if not parts:
        raise Refused("invalid_path", "the workspace root itself is not removed")
    d = walk(root, parts[:-1])
    try:
        name = parts[-1]
        try:
            st = os.lstat(name, dir_fd=d)
        except OSError as e:
            raise resolve_error(e)
        if stat.S_ISDIR(st.st_mode):
            if recursive:
                sub = os.open(name, D, dir_fd=d)
                try:
                    remove_tree(sub)
                finally:
                    os.close(sub)
            try:
                os.rmdir(name, dir_fd=d)
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise Refused("is_a_directory", "")
                raise
        else:
            os.unlink(name, dir_fd=d)
    finally:
        os.close(d)
    out("OK {}")


def op_spill(root, parts, keep):
    # The full text of a cut stream (stdin) at .cellhost/output/NAME in
    # the workspace, renamed into place; then only the newest `keep`
    # cell-* files stay (as a local kernel's spill does).
    if len(parts) < 2:
        raise Refused("invalid_path", "name a file under a directory")
    d = walk(root, parts[:-1], make=True)
    tmp = ".cellhost-upload-%s" % os.urandom(8).hex()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=d)
        try:
            try:
                os.fchmod(fd, 0o644)
                while True:
                    b = sys.stdin.buffer.read(CHUNK)
                    if not b:
                        break
                    v = memoryview(b)
                    while v:
                        v = v[os.write(fd, v):]
            finally:
                os.close(fd)
            os.rename(tmp, parts[-1], src_dir_fd=d, dst_dir_fd=d)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=d)
            except OSError:
                pass
            raise
        spills = []
        for n in os.listdir(d):
            try:
                st = os.lstat(n, dir_fd=d)
            except OSError:
                continue
            if n.startswith("cell-") and stat.S_ISREG(st.st_mode):
                spills.append((st.st_mtime_ns, n))
        spills.sort()
        for _, n in spills[: max(len(spills) - keep, 0)]:
            try:
                os.unlink(n, dir_fd=d)
            except OSError:
                pass
    finally:
        os.close(d)
    out("OK {}")


def op_drop(base, key):
    # Remove the session's home (KEY's first two parts: scope/session).
    try:
        fd, _ = base_fd(base, False)
    except FileNotFoundError:
        out("OK {}")
        return
    parts = key.split("/")
    try:
        d = walk(fd, parts[:-1])
    except Refused:
        os.close(fd)
        out("OK {}")
        return
    os.close(fd)
    try:
        sub = os.open(parts[-1], D, dir_fd=d)
        try:
            remove_tree(sub)
        finally:
            os.close(sub)
        os.rmdir(parts[-1], dir_fd=d)
    except OSError:
        pass
    finally:
        os.close(d)
    out("OK {}")


def main():
    op, base, key, rel = sys.argv[1:5]
    args = sys.argv[5:]
    try:
        if op == "drop":
            return op_drop(base, key)
        parts = parts_of(rel)
        make = op in ("root", "write", "spill")
        root, path = root_fd(base, key, make)
        if root is None:
            if op == "list" and not parts:
                return out("OK " + json.dumps({"entries": [], "truncated": False}))
            if op == "usage":
                return out("OK 0")
            if op == "stat" and not parts:
                return out("OK " + json.dumps({"kind": "dir"}))
            raise Refused("not_found", "")
        try:
            if op == "root":
                # stdin: {"packages": the [packages] policy}, written
                # beside the workspace for the runner's `%pip`.
                req = json.loads(sys.stdin.buffer.read() or b"{}")
                if "packages" in req:
                    home = os.path.dirname(path)
                    tmp = os.path.join(home, ".packages.json.tmp")
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                    with os.fdopen(fd, "w") as f:
                        json.dump(req["packages"], f)
                    os.rename(tmp, os.path.join(home, "packages.json"))
                out("OK " + json.dumps({"path": path}))
            elif op == "write":
                op_write(root, parts, int(args[0]), int(args[1]))
            elif op == "read":
                op_read(root, parts, int(args[0]), int(args[1]))
            elif op == "stat":
                op_stat(root, parts)
            elif op == "list":
                op_list(root, parts, args[0] == "1", int(args[1]))
            elif op == "rm":
                op_rm(root, parts, args[0] == "1")
            elif op == "spill":
                op_spill(root, parts, int(args[0]))
            elif op == "usage":
                out("OK %d" % usage(root))
            else:
                raise Refused("io", "unknown operation %r" % op)
        finally:
            os.close(root)
    except Refused as e:
        out("ERR %s %s" % (e.code, e))
    except OSError as e:
        r = resolve_error(e)
        if isinstance(r, Refused):
            out("ERR %s %s" % (r.code, r))
        else:
            out("ERR io %s" % e)


main()
