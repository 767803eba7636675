//! A local package index for the `%pip` tests: tiny wheels and one sdist
//! written by hand (real archives pip installs), served as a PEP 503 simple
//! index by Python's stdlib HTTP server on loopback. The server stops when
//! the [`Index`] is dropped.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Builds the index in `argv[1]` and serves it on 127.0.0.1 (a free port,
/// printed on the first line of stdout).
const SERVE: &str = r#"
import base64, hashlib, http.server, io, os, sys, tarfile, zipfile, functools

root = sys.argv[1]

def wheel(name, version, files):
    dist = "%s-%s.dist-info" % (name, version)
    files = dict(files)
    files[dist + "/METADATA"] = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version)
    files[dist + "/WHEEL"] = "Wheel-Version: 1.0\nGenerator: cellhost-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
    record.append(dist + "/RECORD,,")
    files[dist + "/RECORD"] = "\n".join(record) + "\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return "%s-%s-py3-none-any.whl" % (name, version), buf.getvalue()

def sdist(name, version):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for path, text in {
            "PKG-INFO": "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version),
            "setup.py": "from setuptools import setup\nsetup(name=%r, version=%r, py_modules=[%r])\n" % (name, version, name),
            name + ".py": "VALUE = 'from source'\n",
        }.items():
            data = text.encode()
            info = tarfile.TarInfo("%s-%s/%s" % (name, version, path))
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return "%s-%s.tar.gz" % (name, version), buf.getvalue()

packages = {
    "tinypkg": [wheel("tinypkg", "1.0", {"tinypkg/__init__.py": "VALUE = 42\n"})],
    "tinydep": [wheel("tinydep", "1.0", {"tinydep/__init__.py": "WHO = 'dep'\n"})],
    "evilpkg": [wheel("evilpkg", "1.0", {"evilpkg/__init__.py": "VALUE = 'evil'\n"})],
    "sdistpkg": [sdist("sdistpkg", "1.0")],
}
simple = os.path.join(root, "simple")
os.makedirs(simple, exist_ok=True)
links = []
for name, files in packages.items():
    d = os.path.join(simple, name)
    os.makedirs(d, exist_ok=True)
    rows = []
    for fname, data in files:
        with open(os.path.join(d, fname), "wb") as f:
            f.write(data)
        rows.append('<a href="%s#sha256=%s">%s</a>' % (fname, hashlib.sha256(data).hexdigest(), fname))
    with open(os.path.join(d, "index.html"), "w") as f:
        f.write("<html><body>%s</body></html>" % "".join(rows))
    links.append('<a href="%s/">%s</a>' % (name, name))
with open(os.path.join(simple, "index.html"), "w") as f:
    f.write("<html><body>%s</body></html>" % "".join(links))

class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=root))
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

pub struct Index {
    child: Child,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Index {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Build and serve the index (with the test venv's Python).
pub fn serve() -> Index {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(super::venv_python())
        .args(["-c", SERVE])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the index server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().parse().expect("the index server's port");
    Index {
        child,
        url: format!("http://127.0.0.1:{port}/simple"),
        _dir: dir,
    }
}

/// `[packages]` pointing at `index`, as the config file would say it.
pub fn policy(index: &Index, extra: &str) -> std::sync::Arc<cellhost::config::PackagesConfig> {
    let text = format!("[packages]\nindex_url = {:?}\n{extra}", index.url);
    let config = cellhost::config::Config::parse(&text, std::path::Path::new("test.toml")).unwrap();
    std::sync::Arc::new(config.packages)
}
