//! Tool RPC: cells call the agent's tools through the generated `tools`
//! module, over the kernel's socket, under the running cell's authority.
//! Real kernels, real sockets, real tools (closures that record calls).

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use cellhost::{Cell, Status};
use common::tools::{toolset, Log};
use common::{kernel, TestKernel};

async fn with_tools() -> (TestKernel, Log, cellhost::ToolSet) {
    let log = Log::default();
    let set = toolset(&log);
    (kernel().await, log, set)
}

fn cell(code: &str, set: &cellhost::ToolSet) -> Cell {
    Cell::new(code).tools(set.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_functions_with_keyword_arguments_and_docstrings() {
    let (k, log, set) = with_tools().await;
    let r = k
        .run_cell(cell(
            "import tools\nr = tools.echo(text='ab', n=3)\nprint(r)\nprint(tools.call('echo', text='x'))\nprint(tools.echo.__doc__.splitlines()[0])\nsorted(tools.names)",
            &set,
        ))
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(
        r.stdout,
        "{'echo': 'ababab'}\n{'echo': 'x'}\nRepeat `text` n times.\n"
    );
    assert_eq!(
        r.value.as_deref(),
        Some("['boom', 'echo', 'fail', 'nap', 'noop', 'slow']")
    );
    assert_eq!(r.tool_calls_made, 2);
    assert_eq!(log.count("echo"), 2);
    // A missing required argument is Python's own TypeError: the call never
    // leaves the kernel.
    let r = k.run_cell(cell("tools.echo()", &set)).await;
    assert_eq!(r.status, Status::Error);
    assert!(
        r.error.as_deref().unwrap().starts_with("TypeError"),
        "{r:?}"
    );
    assert_eq!(r.tool_calls_made, 0);
    assert_eq!(log.count("echo"), 2);
    // Values persist as ordinary Python objects.
    let r = k.run("r['echo'].upper()").await;
    assert_eq!(r.value.as_deref(), Some("'ABABAB'"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_without_tools_has_no_tools_module() {
    let (k, _log, _set) = with_tools().await;
    let r = k.run("import tools").await;
    assert_eq!(r.status, Status::Error);
    assert!(
        r.error.as_deref().unwrap().contains("ModuleNotFoundError"),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_errors_and_panics_raise_tool_error_and_the_kernel_lives() {
    let (k, log, set) = with_tools().await;
    let r = k
        .run_cell(cell(
            "import tools\ntry:\n    tools.fail(why='nope')\nexcept tools.ToolError as e:\n    print('caught', e)\ntools.boom()",
            &set,
        ))
        .await;
    assert_eq!(r.stdout, "caught failed on purpose: nope\n");
    assert_eq!(r.status, Status::Error);
    let err = r.error.as_deref().unwrap();
    assert!(
        err.starts_with("tools.ToolError: ") && err.contains("panicked (the boom tool exploded)"),
        "{err}"
    );
    assert_eq!(r.tool_calls_made, 2);
    assert_eq!(log.names(), ["fail", "boom"]);
    let r = k
        .run_cell(cell("tools.echo(text='still here')", &set))
        .await;
    assert_eq!(r.value.as_deref(), Some("{'echo': 'still here'}"));
    assert!(!r.kernel.state_lost);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_cells_rpc_runs_under_that_cells_authority() {
    let (k, log, set) = with_tools().await;
    let r = k
        .run_cell(cell("import tools\ntools.echo(text='1')", &set).allow(["echo"]))
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    // Cell 2 may call noop only: echo is refused before it reaches the tool.
    let r = k
        .run_cell(
            cell(
                "tools.noop()\ntry:\n    tools.echo(text='2')\nexcept tools.ToolError as e:\n    print(e)",
                &set,
            )
            .allow(["noop"]),
        )
        .await;
    assert_eq!(
        r.stdout,
        "tool \"echo\" is not allowed in this cell (allowed: noop)\n"
    );
    assert_eq!(r.tool_calls_made, 1);
    assert_eq!(log.names(), ["echo", "noop"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_cell_alias_dispatches_under_the_current_cell() {
    let (k, log, set) = with_tools().await;
    let r = k
        .run_cell(cell("import tools\nf = tools.echo\ng = tools.call", &set).max_tool_calls(5))
        .await;
    assert_eq!(r.tool_calls_made, 0);
    // Called in cell 2, the saved callables spend cell 2's budget (1) and
    // obey its allow-list.
    let code = "print(f(text='a'))\ntry:\n    g('echo', text='b')\nexcept Exception as e:\n    print(type(e).__name__, e)";
    let r = k.run_cell(cell(code, &set).max_tool_calls(1)).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[0], "{'echo': 'a'}");
    assert!(
        lines[1].starts_with("ToolError tool budget exhausted") && lines[1].contains("at most 1"),
        "{lines:?}"
    );
    assert_eq!(r.tool_calls_made, 1);
    let r = k.run_cell(cell("f(text='c')", &set).allow(["noop"])).await;
    assert_eq!(r.status, Status::Error);
    assert!(r
        .error
        .as_deref()
        .unwrap()
        .contains("not allowed in this cell"));
    assert_eq!(log.count("echo"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_cells_authority_refuses_dispatch() {
    let (k, log, set) = with_tools().await;
    // A thread outlives its cell: it calls a tool only once the test says
    // so (after the cell settled), and writes what it got to a file.
    let go = k.dir.path().join("go");
    let got = k.dir.path().join("got");
    let code = format!(
        "import tools, threading, time, os\ndef late():\n    while not os.path.exists({go:?}):\n        time.sleep(0.01)\n    try:\n        r = repr(tools.echo(text='late'))\n    except tools.ToolError as e:\n        r = str(e)\n    open({got:?} + '.tmp', 'w').write(r)\n    os.rename({got:?} + '.tmp', {got:?})\nthreading.Thread(target=late).start()",
        go = go.to_str().unwrap(),
        got = got.to_str().unwrap(),
    );
    let r = k.run_cell(cell(&code, &set)).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.tool_calls_made, 0);
    std::fs::write(&go, "").unwrap();
    assert!(
        common::registry::eventually(Duration::from_secs(10), || got.exists()).await,
        "the late thread never called"
    );
    let v = std::fs::read_to_string(&got).unwrap();
    assert!(
        v.contains("refused: no cell is running in this kernel"),
        "{v}"
    );
    assert_eq!(log.count("echo"), 0, "the late call never reached the tool");
    // A later cell given no tools refuses too, and says so.
    let r = k.run("tools.echo(text='x')").await;
    assert!(
        r.error
            .as_deref()
            .unwrap()
            .contains("this cell was given no tools"),
        "{r:?}"
    );
    assert_eq!(log.count("echo"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_is_cancelled_when_its_kernel_is_killed_after_the_grace() {
    let (k, log, set) = with_tools().await;
    // The cell ignores SIGINT: the timeout's interrupt cannot stop it, so
    // the kernel is killed after the grace, and the call with it.
    let r = k
        .run_cell(
            cell(
                "import signal, tools\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntools.slow()",
                &set,
            )
            .timeout(Duration::from_millis(500)),
        )
        .await;
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert!(r.kernel.state_lost, "{r:?}");
    assert!(
        common::registry::eventually(Duration::from_secs(5), || log
            .cancelled
            .load(Ordering::SeqCst))
        .await,
        "the tool call was not cancelled"
    );
    let r = k
        .run_cell(cell("import tools\ntools.echo(text='next')", &set))
        .await;
    assert_eq!(r.value.as_deref(), Some("{'echo': 'next'}"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payload_limit_applies_to_requests_and_results() {
    let log = Log::default();
    let set = toolset(&log);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = common::options(&dir);
    opts.max_tool_payload = 4096;
    let k = common::kernel_with(opts, dir).await;
    let code = "import tools\nout = []\nfor kw in (dict(text='x' * 5000), dict(text='x' * 100, n=100), dict(text='ok')):\n    try:\n        out.append(repr(tools.echo(**kw))[:20])\n    except tools.ToolError as e:\n        out.append(str(e))\nprint('\\n'.join(out))";
    let r = k.run_cell(cell(code, &set)).await;
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{r:?}");
    assert!(
        lines[0].starts_with("the request to echo is 50")
            && lines[0].contains("over the 4096-byte limit"),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with("the result of tool \"echo\" is 100")
            && lines[1].contains("over the 4096-byte limit"),
        "{lines:?}"
    );
    assert_eq!(lines[2], "{'echo': 'ok'}");
    assert_eq!(
        log.count("echo"),
        2,
        "the oversize request never left the kernel"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_cell_installs_a_fresh_authority_and_budget() {
    let (k, log, set) = with_tools().await;
    let code = "import tools\nn = 0\nfor i in range(5):\n    try:\n        tools.noop()\n        n += 1\n    except tools.ToolError:\n        pass\nn";
    for _ in 0..3 {
        let r = k.run_cell(cell(code, &set).max_tool_calls(3)).await;
        assert_eq!(r.value.as_deref(), Some("3"), "{r:?}");
        assert_eq!(r.tool_calls_made, 3);
    }
    assert_eq!(log.count("noop"), 9);
    // The default budget is 50.
    let code = "for i in range(60):\n    try:\n        tools.noop()\n    except tools.ToolError as e:\n        print(i, e)\n        break";
    let r = k.run_cell(cell(code, &set)).await;
    assert!(
        r.stdout.starts_with("50 tool budget exhausted"),
        "{}",
        r.stdout
    );
    assert_eq!(r.tool_calls_made, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_of_one_cell_call_tools_concurrently() {
    let (k, log, set) = with_tools().await;
    let code = "import tools, threading\nres = []\ndef work(i):\n    for j in range(5):\n        res.append(tools.nap(ms=40 + i))\nts = [threading.Thread(target=work, args=(i,)) for i in range(8)]\nfor t in ts: t.start()\nfor t in ts: t.join()\nsorted(set(res)), len(res)";
    let r = k.run_cell(cell(code, &set).max_tool_calls(100)).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(
        r.value.as_deref(),
        Some("([40, 41, 42, 43, 44, 45, 46, 47], 40)")
    );
    assert_eq!(r.tool_calls_made, 40);
    assert_eq!(log.count("nap"), 40);
    assert!(
        log.most_at_once.load(Ordering::SeqCst) > 1,
        "calls from different threads ran one at a time"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_tool_is_cancelled_when_its_cell_times_out_and_state_is_kept() {
    let (k, log, set) = with_tools().await;
    k.run("kept = 42").await;
    let r = k
        .run_cell(cell("import tools\ntools.slow()", &set).timeout(Duration::from_millis(800)))
        .await;
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert!(
        !r.kernel.state_lost,
        "the interrupt stopped the cell: {r:?}"
    );
    assert!(log.slow_started.load(Ordering::SeqCst));
    assert_eq!(r.tool_calls_made, 1);
    assert!(
        common::registry::eventually(Duration::from_secs(5), || log
            .cancelled
            .load(Ordering::SeqCst))
        .await,
        "the tool call was not cancelled"
    );
    let r = k.run_cell(cell("tools.echo(text=str(kept))", &set)).await;
    assert_eq!(r.value.as_deref(), Some("{'echo': '42'}"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_stays_out_of_the_cells_environment_and_output() {
    let (k, _log, set) = with_tools().await;
    let r = k
        .run_cell(cell(
            "import os, subprocess, tools\nprint(os.environ.get('CELLHOST_TOOLS_TOKEN'))\nprint(subprocess.run(['sh', '-c', 'echo ${CELLHOST_TOOLS_TOKEN:-unset}'], capture_output=True, text=True).stdout.strip())\nprint(tools._TOKEN)",
            &set,
        ))
        .await;
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[..2], ["None", "unset"], "{r:?}");
    assert_eq!(
        lines[2], "[REDACTED:secret]",
        "the token is redacted from output: {r:?}"
    );
}
