//! The agent's dialect in real kernels: `!cmd`, `x = !cmd`, `%%bash`,
//! `%cd`, `%time` and friends, expansion, line numbers after a transformed
//! line, unsupported magics, and the hints.
mod common;

use cellhost::Status;
use common::*;

/// Move the kernel into a fresh temp dir (cells here write files).
async fn in_a_temp_dir(k: &TestKernel) {
    let r = k
        .run("import os, tempfile\nos.chdir(tempfile.mkdtemp())")
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test]
async fn a_bang_command_prints_into_the_cells_stdout() {
    let k = kernel().await;
    in_a_temp_dir(&k).await;
    let r = k
        .run("import os\nos.makedirs('d', exist_ok=True)\nopen('d/f.txt', 'w').close()\n!ls d")
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.stdout, "f.txt\n", "{r:?}");
    assert_eq!(r.value, None, "{r:?}");
}

#[tokio::test]
async fn a_bang_command_runs_in_the_kernels_cwd_and_keeps_order_with_print() {
    let k = kernel().await;
    let r = k
        .run("import os\nprint('before')\n!pwd\n!echo err >&2\nprint('after')\nos.getcwd()")
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let cwd = r.value.as_deref().unwrap().trim_matches('\'').to_owned();
    assert_eq!(r.stdout, format!("before\n{cwd}\nafter\n"), "{r:?}");
    assert_eq!(r.stderr, "err\n", "{r:?}");
}

#[tokio::test]
async fn assigning_a_bang_command_captures_its_lines() {
    let k = kernel().await;
    let r = k
        .run("x = !echo hi; echo there\n(x, type(x).__name__, x.n, _exit_code)")
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(
        r.value.as_deref(),
        Some("(['hi', 'there'], 'SList', 'hi\\nthere', 0)"),
        "{r:?}"
    );
    assert_eq!(r.stdout, "", "{r:?}");
}

#[tokio::test]
async fn a_failing_command_sets_exit_code_and_the_cell_goes_on() {
    let k = kernel().await;
    let r = k
        .run("!false\na = _exit_code\n!exit 3\n(a, _exit_code)")
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.value.as_deref(), Some("(1, 3)"), "{r:?}");
}

#[tokio::test]
async fn braces_and_dollar_names_expand_as_ipython_does() {
    let k = kernel().await;
    let r = k
        .run(concat!(
            "n = 3\nname = 'world'\n",
            "!echo {n + 1} $name $$literal '$name'\n",
            // A name Python does not have: the command runs as written.
            "!echo $NO_SUCH_PY_NAME_X {n}\n",
            "def f(v):\n    out = !echo in-f {v}\n    return out\n",
            "f(7)",
        ))
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    // `$$literal` reaches the shell as `$literal` (unset: empty), `'$name'`
    // as is; the shell expands what is left.
    assert_eq!(r.stdout, "4 world $name\n{n}\n", "{r:?}");
    assert_eq!(r.value.as_deref(), Some("['in-f 7']"), "{r:?}");
}

#[tokio::test]
async fn a_bash_cell_runs_its_body_through_the_shell() {
    let k = kernel().await;
    let r = k
        .run("%%bash\nfor i in 1 2; do echo \"n=$i\"; done\necho oops >&2\nexit 4")
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.stdout, "n=1\nn=2\n", "{r:?}");
    assert_eq!(r.stderr, "oops\n", "{r:?}");
    assert_eq!(k.run("_exit_code").await.value.as_deref(), Some("4"));
    let r = k.run("%%sh\necho {not expanded} $0").await;
    assert!(r.stdout.starts_with("{not expanded} "), "{r:?}");
}

#[tokio::test]
async fn writefile_writes_the_cell_body() {
    let k = kernel().await;
    in_a_temp_dir(&k).await;
    let r = k.run("%%writefile hello.py\nprint('hi from file')").await;
    assert_eq!(r.stdout, "Writing hello.py\n", "{r:?}");
    let r = k.run("exec(open('hello.py').read())").await;
    assert_eq!(r.stdout, "hi from file\n", "{r:?}");
}

#[tokio::test]
async fn cd_and_pwd_move_the_kernel_and_its_commands() {
    let k = kernel().await;
    let r = k
        .run("import os, tempfile\nd = os.path.realpath(tempfile.mkdtemp())\n%cd {d}\n(os.getcwd() == d, %pwd)")
        .await;
    // `%pwd` is not a statement start inside the tuple: a SyntaxError.
    assert_eq!(r.status, Status::Error, "{r:?}");
    let r = k
        .run("import os, tempfile\nd = os.path.realpath(tempfile.mkdtemp())\n%cd {d}\nhere = %pwd\nnow = !pwd\n(os.getcwd() == d, here == d, now == [d])")
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.value.as_deref(), Some("(True, True, True)"), "{r:?}");
    assert!(
        r.stdout.ends_with("\n") && r.stdout.lines().count() == 1,
        "{r:?}"
    );
    // Still there in the next cell; `%cd -` goes back.
    let r = k.run("%cd -q -\nimport os\nos.getcwd() != d").await;
    assert_eq!(r.value.as_deref(), Some("True"), "{r:?}");
}

#[tokio::test]
async fn time_runs_the_statement_once_and_says_how_long() {
    let k = kernel().await;
    let r = k
        .run("calls = []\n%time calls.append(1) or sum(range(10))")
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.value.as_deref(), Some("45"), "{r:?}");
    assert!(r.stdout.starts_with("CPU times: user "), "{r:?}");
    assert!(r.stdout.contains("\nWall time: "), "{r:?}");
    assert_eq!(k.run("calls").await.value.as_deref(), Some("[1]"));
    let r = k.run("%%time\nt = 2\nt * 21").await;
    assert_eq!(r.value.as_deref(), Some("42"), "{r:?}");
    let r = k.run("%timeit -n 3 -r 2 x = 1").await;
    assert!(
        r.stdout
            .contains("per loop (mean ± std. dev. of 2 runs, 3 loops each)"),
        "{r:?}"
    );
}

#[tokio::test]
async fn env_who_and_matplotlib_inline_work() {
    let k = kernel().await;
    let r = k
        .run("%env CELLHOST_DIALECT_T=yes\nimport os\nalpha = 1\nbeta = 'b'\n%who\n%matplotlib inline\n(os.environ['CELLHOST_DIALECT_T'], %env CELLHOST_DIALECT_T)")
        .await;
    // `%env` inside a tuple is not a statement start: a SyntaxError.
    assert_eq!(r.status, Status::Error, "{r:?}");
    let r = k
        .run("%env CELLHOST_DIALECT_T=yes\nimport os\nalpha = 1\nbeta = 'b'\n%who\n%matplotlib inline\nv = %env CELLHOST_DIALECT_T\nv")
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.value.as_deref(), Some("'yes'"), "{r:?}");
    assert_eq!(
        r.stdout, "env: CELLHOST_DIALECT_T=yes\nalpha\tbeta\tos\n",
        "{r:?}"
    );
}

#[tokio::test]
async fn a_traceback_after_a_transformed_line_names_the_right_line() {
    let k = kernel().await;
    let r = k
        .run("x = 1\n!true\nfiles = !echo a\n\ndef f():\n    !true\n    return 1 / 0\nf()")
        .await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    let tb = r.traceback.unwrap();
    assert!(tb.contains("line 7, in f"), "{tb}");
    assert!(tb.contains("return 1 / 0"), "{tb}");
    assert!(tb.contains("line 8, in <module>"), "{tb}");
    // The runner's and the helpers' own frames are not shown.
    assert!(
        !tb.contains("magics.py") && !tb.contains("runner.py"),
        "{tb}"
    );
    let r = k.run("\n%time 1 / 0").await;
    let tb = r.traceback.unwrap();
    assert!(
        tb.contains("line 2, in <module>") && tb.contains("%time 1 / 0"),
        "{tb}"
    );
    assert!(!tb.contains("magics.py"), "{tb}");
}

#[tokio::test]
async fn an_unsupported_magic_is_an_error_naming_the_supported_ones() {
    let k = kernel().await;
    let r = k.run("x = 1\n%load_ext autoreload\nx = 2").await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    let e = r.error.unwrap();
    assert!(
        e.starts_with("SyntaxError: unsupported magic %load_ext"),
        "{e}"
    );
    assert!(
        e.contains("%pip") && e.contains("%%bash") && e.contains("%cd"),
        "{e}"
    );
    assert!(r.traceback.unwrap().contains("line 2"));
    let hint = r.hint.expect("a hint");
    assert!(
        hint.contains("cellhost supports") && hint.contains("%timeit"),
        "{hint}"
    );
    // Nothing of the cell ran.
    assert_eq!(
        k.run("x").await.error.as_deref(),
        Some("NameError: name 'x' is not defined")
    );
}

#[tokio::test]
async fn python_that_only_looks_like_the_dialect_runs_untouched() {
    let k = kernel().await;
    let code = concat!(
        "s = \"\"\"\n!echo not a command\n%not a magic\n  !indented\n\"\"\"\n",
        "t = '''\n%%bash\n'''\n",
        "a, b = 7, 3\n",
        "m = (a\n     % b)\n",
        "n = a \\\n% b\n",
        "ne = a != b\n",
        "f = \"%d!\" % a\n",
        "g = 'x=%s' % (a,)\n",
        "d = {k: v % 2 for k, v in [(1, 3)]}\n",
        "e = {v % 2 for v in (3, 4)}\n",
        "# !comment\n",
        "fs = f'{a=!r}'\n",
        "(s, t, m, n, ne, f, g, d, e, fs)",
    );
    let r = k.run(code).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(
        r.value.as_deref(),
        Some("('\\n!echo not a command\\n%not a magic\\n  !indented\\n', '\\n%%bash\\n', 1, 1, True, '7!', 'x=7', {1: 1}, {0, 1}, 'a=7')"),
        "{r:?}"
    );
    assert_eq!(r.stdout, "", "{r:?}");
}

/// Every pip spelling reaches the host-side `pip_magic` (which names the
/// forms it supports; packages.rs tests the installs themselves), never a
/// pip run inside the kernel.
#[tokio::test]
async fn pip_lines_go_to_pip_magic() {
    let k = kernel().await;
    for (code, line) in [
        ("%pip --version", "`%pip --version`"),
        ("!pip --version > /dev/null", "`%pip --version`"),
        ("!pip3 freeze", "`%pip freeze`"),
        (
            "!python -m pip no-such-subcommand",
            "`%pip no-such-subcommand`",
        ),
    ] {
        let r = k.run(code).await;
        assert_eq!(r.status, Status::Error, "{code}: {r:?}");
        // The host's answer (this bare kernel has no package dir, or the
        // form is not one pip_magic supports), never a pip run in the kernel.
        let error = r.error.as_deref().unwrap_or("");
        assert!(error.starts_with("pipmagic.PipError: "), "{code}: {r:?}");
        assert!(
            error.contains(line) || error.contains("no package dir"),
            "{code}: {r:?}"
        );
        assert!(!r.stdout.starts_with("pip "), "{code}: {r:?}");
    }
}

#[tokio::test]
async fn an_interrupted_command_stops_and_the_kernel_keeps_its_state() {
    let k = kernel().await;
    k.run("kept = 5").await;
    let cell = cellhost::Cell::new("!sleep 30; echo not-reached")
        .timeout(std::time::Duration::from_millis(700));
    let started = std::time::Instant::now();
    let r = k.run_cell(cell).await;
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert!(!r.kernel.state_lost, "{r:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    let r = k.run("kept").await;
    assert_eq!(r.value.as_deref(), Some("5"), "{r:?}");
    assert!(!r.stdout.contains("not-reached"), "{r:?}");
}

#[tokio::test]
async fn a_missing_module_hints_how_to_install_it() {
    let k = kernel().await;
    let r = k.run("import sklearn_nope_cellhost").await;
    assert_eq!(
        r.hint.as_deref(),
        Some("install it with `%pip install sklearn_nope_cellhost`; packages persist for this session"),
        "{r:?}"
    );
    // Import names that are not the distribution's name.
    let r = k
        .run("import sys\nsys.modules.pop('yaml', None)\nsys.path[:] = [p for p in sys.path if 'site-packages' not in p]\nimport yaml")
        .await;
    assert!(
        r.hint
            .as_deref()
            .unwrap_or("")
            .contains("%pip install pyyaml"),
        "{r:?}"
    );
    // A missing submodule of a package that is there: no install hint.
    let r = k.run("import json.nope_cellhost").await;
    assert_eq!(r.status, Status::Error);
    assert_eq!(r.hint, None, "{r:?}");
    // Other errors: none.
    assert_eq!(k.run("1/0").await.hint, None);
}

#[tokio::test]
async fn a_strict_kernel_runs_bang_commands_and_says_it_has_no_network() {
    let k = strict_kernel().await;
    let r = k
        .run("!echo inside; pwd\nx = !ls /\n'workspace' in x")
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.stdout, "inside\n/workspace\n", "{r:?}");
    assert_eq!(r.value.as_deref(), Some("True"), "{r:?}");
    let r = k
        .run("import socket\nsocket.getaddrinfo('example.com', 80)")
        .await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    let hint = r.hint.expect("a network hint");
    assert!(
        hint.contains("no network")
            && hint.contains("\"off\"")
            && hint.contains("[sandbox] network"),
        "{hint}"
    );
    let r = k.run("import tabulate_not_here_x").await;
    assert!(r.hint.unwrap().contains("%pip install tabulate_not_here_x"));
}

#[tokio::test]
async fn an_unsandboxed_kernel_gives_no_network_hint() {
    let k = kernel().await;
    let r = k
        .run("import socket\nraise socket.gaierror(-3, 'Temporary failure in name resolution')")
        .await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert_eq!(r.hint, None, "{r:?}");
}
