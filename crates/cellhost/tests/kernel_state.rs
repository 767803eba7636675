//! State semantics: persistence, reset, values, errors, sys.exit.
mod common;

use cellhost::{Cell, Status};
use common::*;

#[tokio::test]
async fn state_persists_across_cells() {
    let k = kernel().await;
    let r = k.run("x = 41").await;
    assert_eq!(r.status, Status::Success);
    assert!(!r.kernel.reused, "the first cell gets a new kernel");
    let r = k.run("x + 1").await;
    assert_eq!(r.value.as_deref(), Some("42"));
    assert!(r.kernel.reused);
    assert_eq!(r.kernel.execution_count, 2);
    assert!(!r.kernel.state_lost && !r.kernel.state_reset && !r.kernel.ended);
    assert!(r.kernel.note.is_none());
}

#[tokio::test]
async fn imports_persist() {
    let k = kernel().await;
    k.run("import json as j").await;
    let r = k.run("j.dumps([1])").await;
    assert_eq!(r.value.as_deref(), Some("'[1]'"));
}

#[tokio::test]
async fn reset_discards_state_and_says_so() {
    let k = kernel().await;
    k.run("x = 1").await;
    let pid = k.kernel.pid().unwrap();
    let r = k.run_cell(Cell::new("'x' in globals()").reset(true)).await;
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(r.kernel.state_reset);
    assert!(!r.kernel.state_lost);
    assert!(!r.kernel.reused);
    assert_eq!(r.kernel.execution_count, 1);
    assert!(r.kernel.note.as_deref().unwrap().contains("reset"));
    assert!(
        wait_gone(pid, std::time::Duration::from_secs(2)),
        "old process is gone"
    );
}

#[tokio::test]
async fn a_cell_ending_in_an_expression_returns_its_repr() {
    let k = kernel().await;
    assert_eq!(k.run("'a' * 3").await.value.as_deref(), Some("'aaa'"));
    assert_eq!(k.run("y = 2\ny * 10").await.value.as_deref(), Some("20"));
    assert_eq!(k.run("None").await.value, None);
    assert_eq!(k.run("z = 5").await.value, None);
    // Like the REPL, `_` holds the last value.
    assert_eq!(k.run("_").await.value.as_deref(), Some("20"));
}

#[tokio::test]
async fn an_exception_keeps_the_kernel_and_its_state() {
    let k = kernel().await;
    k.run("x = 7").await;
    let pid = k.kernel.pid();
    let r = k.run("def f():\n    return 1 / 0\nf()").await;
    assert_eq!(r.status, Status::Error);
    assert_eq!(
        r.error.as_deref(),
        Some("ZeroDivisionError: division by zero")
    );
    let tb = r.traceback.unwrap();
    assert!(tb.contains("<cell-2>"), "{tb}");
    assert!(tb.contains("return 1 / 0"), "source lines shown: {tb}");
    assert!(!tb.contains("runner.py"), "runner frames hidden: {tb}");
    assert!(!r.kernel.state_lost);
    let r = k.run("x").await;
    assert_eq!(r.value.as_deref(), Some("7"));
    assert_eq!(k.kernel.pid(), pid);
}

#[tokio::test]
async fn a_syntax_error_is_reported_and_harmless() {
    let k = kernel().await;
    let r = k.run("def (:").await;
    assert_eq!(r.status, Status::Error);
    assert!(
        r.error.as_deref().unwrap().starts_with("SyntaxError"),
        "{r:?}"
    );
    assert!(!r.traceback.unwrap().contains("runner.py"));
    assert_eq!(k.run("1 + 1").await.value.as_deref(), Some("2"));
}

#[tokio::test]
async fn recursion_error_keeps_the_kernel() {
    let k = kernel().await;
    k.run("keep = 'me'").await;
    let r = k.run("def f(n): return f(n + 1)\nf(0)").await;
    assert_eq!(r.status, Status::Error);
    assert!(r.error.unwrap().starts_with("RecursionError"));
    assert!(r.traceback.unwrap().len() < 60_000, "traceback is bounded");
    assert_eq!(k.run("keep").await.value.as_deref(), Some("'me'"));
}

#[tokio::test]
async fn sys_exit_ends_the_kernel_and_the_next_cell_says_so() {
    let k = kernel().await;
    k.run("x = 1").await;
    let pid = k.kernel.pid().unwrap();
    let r = k.run("import sys; sys.exit()").await;
    assert_eq!(r.status, Status::Success);
    assert!(r.kernel.ended);
    assert!(r.kernel.note.as_deref().unwrap().contains("sys.exit"));
    assert!(wait_gone(pid, std::time::Duration::from_secs(2)));
    let r = k.run("'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(!r.kernel.reused);
    assert!(!r.kernel.ended);
    assert_eq!(r.kernel.execution_count, 1);
    assert!(r.kernel.note.as_deref().unwrap().contains("fresh kernel"));
}

#[tokio::test]
async fn sys_exit_with_a_code_is_an_error() {
    let k = kernel().await;
    let r = k.run("raise SystemExit(3)").await;
    assert_eq!(r.status, Status::Error);
    assert_eq!(r.error.as_deref(), Some("SystemExit: 3"));
    assert!(r.kernel.ended);
}

#[tokio::test]
async fn os_exit_in_a_cell_loses_state_and_the_next_call_respawns() {
    let k = kernel().await;
    k.run("x = 1").await;
    let r = k.run("import os; os._exit(3)").await;
    assert_eq!(r.status, Status::Error);
    assert!(
        r.error.as_deref().unwrap().contains("exited with status 3"),
        "{r:?}"
    );
    assert!(r.kernel.state_lost);
    assert!(r.kernel.note.is_some());
    let r = k.run("'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(!r.kernel.reused);
    assert!(
        !r.kernel.state_lost,
        "the loss was reported by the cell that caused it"
    );
}

#[tokio::test]
async fn a_kernel_killed_mid_cell_reports_the_signal_and_stderr_tail() {
    let k = kernel().await;
    let r = k
        .run("import os, signal, sys\nsys.stderr.write('about to die\\n')\nos.kill(os.getpid(), signal.SIGKILL)")
        .await;
    assert_eq!(r.status, Status::Error);
    let err = r.error.unwrap();
    assert!(err.contains("SIGKILL"), "{err}");
    assert!(err.contains("about to die"), "{err}");
    assert!(r.kernel.state_lost);
    assert_eq!(k.run("1").await.value.as_deref(), Some("1"));
}

#[tokio::test]
async fn a_segfault_is_reported_with_a_python_traceback() {
    let k = kernel().await;
    let r = k.run("import ctypes\nctypes.string_at(0)").await;
    assert_eq!(r.status, Status::Error);
    assert!(r.error.unwrap().contains("SIGSEGV"));
    assert!(r.stderr.contains("Fatal Python error"), "{}", r.stderr);
    assert!(r.kernel.state_lost);
}

#[tokio::test]
async fn a_kernel_that_dies_while_idle_is_reported_on_the_next_call() {
    let k = kernel().await;
    k.run("x = 1").await;
    let pid = k.kernel.pid().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    // Give the runtime turns, as a live host would, so the idle kernel's
    // death is noticed before the next cell.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while k.kernel.pid().is_some() && std::time::Instant::now() < end {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(!pid_alive(pid));
    let r = k.run("'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"), "{r:?}");
    assert!(r.kernel.state_lost);
    assert!(!r.kernel.reused);
    assert!(
        r.kernel.note.as_deref().unwrap().contains("SIGKILL"),
        "{:?}",
        r.kernel.note
    );
}

#[tokio::test]
async fn a_five_megabyte_source_cell_runs() {
    let k = kernel().await;
    let code = format!("s = '{}'\nlen(s)", "a".repeat(5 * 1024 * 1024));
    let r = k.run(&code).await;
    assert_eq!(r.value.as_deref(), Some("5242880"), "{:?}", r.error);
}

#[tokio::test]
async fn queued_cells_run_one_at_a_time_in_arrival_order() {
    let k = kernel().await;
    k.run("log = []").await;
    let mut handles = Vec::new();
    for i in 0..10 {
        let kernel = k.kernel.clone();
        let code = format!("import time\nlog.append({i}); time.sleep(0.01); log.append({i})");
        handles.push(tokio::spawn(async move {
            kernel.execute(Cell::new(code)).await
        }));
        tokio::task::yield_now().await;
    }
    for h in handles {
        assert_eq!(h.await.unwrap().unwrap().status, Status::Success);
    }
    let r = k.run("log").await;
    let expected: Vec<String> = (0..10)
        .flat_map(|i| [i.to_string(), i.to_string()])
        .collect();
    assert_eq!(r.value.unwrap(), format!("[{}]", expected.join(", ")));
}

#[tokio::test]
async fn input_fails_fast() {
    let k = kernel().await;
    let t = std::time::Instant::now();
    let r = k.run("input('name? ')").await;
    assert_eq!(r.status, Status::Error);
    assert!(r.error.unwrap().starts_with("EOFError"));
    assert!(t.elapsed() < std::time::Duration::from_secs(2));
}

#[tokio::test]
async fn cells_run_in_main_so_pickle_and_classes_work() {
    let k = kernel().await;
    k.run("class P:\n    pass\nimport pickle").await;
    let r = k
        .run("type(pickle.loads(pickle.dumps(P()))).__name__")
        .await;
    assert_eq!(r.value.as_deref(), Some("'P'"), "{r:?}");
    assert_eq!(k.run("__name__").await.value.as_deref(), Some("'__main__'"));
}

#[tokio::test]
async fn the_value_is_the_last_expression_however_the_cell_is_laid_out() {
    let k = kernel().await;
    let cases: &[(&str, Option<&str>)] = &[
        ("[x\nfor x in range(3)]", Some("[0, 1, 2]")),
        ("f = lambda **k: k\nf(\na=1)", Some("{'a': 1}")),
        ("if True:\n    pass\nelse: pass", None),
        ("a = 1; a", Some("1")),
        ("a = 1;", None),
        ("s = '''\nabc\n'''\ns", Some("'\\nabc\\n'")),
        ("x = 1 if True else \\\n 2\nx", Some("1")),
        ("y = (1 +\n2)\ny", Some("3")),
        ("z = 1\nz += 1\nz", Some("2")),
        ("z == 2", Some("True")),
        ("for i in range(2): pass\ni", Some("1")),
        ("try:\n  q = 1\nexcept Exception:\n  q = 2\nq", Some("1")),
        ("def g():\n    return 5\ng()", Some("5")),
        ("w = 2\nw\n\n# trailing comment\n", Some("2")),
        ("# only a comment", None),
        ("", None),
        ("print('p')", None),
    ];
    for (code, want) in cases {
        let r = k.run(code).await;
        assert_eq!(r.status, Status::Success, "{code:?}: {r:?}");
        assert_eq!(r.value.as_deref(), *want, "{code:?}");
    }
}

#[tokio::test]
async fn errors_point_at_the_right_line_of_the_cell() {
    let k = kernel().await;
    let r = k.run("a = 1\nb = 2\nc = a / 0").await;
    assert!(r.traceback.as_deref().unwrap().contains("line 3"), "{r:?}");
    let r = k.run("a = 1\nb = 2\n1 / 0").await;
    assert!(r.traceback.as_deref().unwrap().contains("line 3"), "{r:?}");
    let r = k.run("x = 1\nundefined_name").await;
    let tb = r.traceback.unwrap();
    assert!(
        tb.contains("line 2") && tb.contains("undefined_name"),
        "{tb}"
    );
}
