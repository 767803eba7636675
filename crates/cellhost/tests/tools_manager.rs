//! Tools through the kernel manager: the tool set is part of the kernel
//! key, names are checked against the registered tools, pooled kernels get
//! their `tools` module on first use, and the strict sandbox can reach the
//! socket.

mod common;

use std::collections::BTreeSet;

use cellhost::registry::{KernelManager, KernelSpec, ManagerError, ManagerOptions};
use cellhost::{Cell, Status, StrictSandbox};
use common::registry::manager_with;
use common::tools::{toolset, Log};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_set_is_part_of_the_kernel_key() {
    let log = Log::default();
    let m = manager_with(|o| o.tools(toolset(&log))).await;
    let run = |spec: KernelSpec, code: &str| {
        let m = m.manager.clone();
        let code = code.to_owned();
        async move {
            m.execute_with("conv", &spec, Cell::new(code))
                .await
                .unwrap()
        }
    };
    let a = run(
        KernelSpec::default().tools(["echo"]),
        "import tools, os\nx = 'a'\nos.getpid()",
    )
    .await;
    let b = run(
        KernelSpec::default().tools(["noop", "echo"]),
        "import os\nos.getpid()",
    )
    .await;
    let a2 = run(
        KernelSpec::default().tools(["echo", "echo"]),
        "import os\nx, os.getpid()",
    )
    .await;
    assert_ne!(a.value, b.value, "another tool set gets another kernel");
    assert_eq!(
        a2.value.as_deref(),
        Some(format!("('a', {})", a.value.unwrap()).as_str()),
        "the same set (any order) gets the same kernel"
    );
    // Each kernel's module has exactly its tools.
    let r = run(
        KernelSpec::default().tools(["echo"]),
        "sorted(tools.names), hasattr(tools, 'noop')",
    )
    .await;
    assert_eq!(r.value.as_deref(), Some("(['echo'], False)"));
    let r = run(
        KernelSpec::default().tools(["noop", "echo"]),
        "import tools\ntools.noop(); tools.echo(text='e')",
    )
    .await;
    assert_eq!(r.value.as_deref(), Some("{'echo': 'e'}"));
    assert_eq!(r.tool_calls_made, 2);
    assert_eq!(m.manager.stats().tool_calls, 2);
    assert_eq!(log.names(), ["noop", "echo"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tools_and_allow_lists_outside_the_set_are_clear_errors() {
    let log = Log::default();
    let m = manager_with(|o| o.tools(toolset(&log))).await;
    let e = m
        .manager
        .execute_with(
            "conv",
            &KernelSpec::default().tools(["echo", "web"]),
            Cell::new("1"),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, ManagerError::Tools(_)));
    assert_eq!(
        e.to_string(),
        "unknown tool \"web\"; the registered tools are: boom, echo, fail, nap, noop, slow"
    );
    let e = m
        .manager
        .execute_with(
            "conv",
            &KernelSpec::default().tools(["echo"]),
            Cell::new("1").allow(["noop"]),
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string().starts_with(
            "the cell's allow-list names \"noop\", which is not among the kernel's tools (echo)"
        ),
        "{e}"
    );
    assert!(m.runner_pids().is_empty(), "nothing was started");
    // The owner is fine afterwards.
    let r = m.run("conv", "1 + 1").await;
    assert_eq!(r.value.as_deref(), Some("2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_kernel_gets_its_tools_module_when_an_owner_takes_it() {
    let log = Log::default();
    let m = manager_with(|o| o.tools(toolset(&log)).warm_pool(1)).await;
    assert!(
        common::registry::eventually(std::time::Duration::from_secs(10), || m.manager.pooled()
            == 1)
        .await
    );
    let spec = KernelSpec::default().tools(["echo"]);
    let r = m
        .manager
        .execute_with(
            "conv",
            &spec,
            Cell::new("import tools\ntools.echo(text='pooled')"),
        )
        .await
        .unwrap();
    assert_eq!(r.value.as_deref(), Some("{'echo': 'pooled'}"), "{r:?}");
    assert_eq!(m.manager.stats().pool_hits, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxed_kernels_reach_their_tools() {
    let log = Log::default();
    let dir = tempfile::tempdir().unwrap();
    let opts = ManagerOptions::new(dir.path().join("data"))
        .kernel(common::strict_options(&dir, StrictSandbox::default()))
        .warm_pool(0)
        .idle_timeout(None)
        .tools(toolset(&log));
    let m = KernelManager::start(opts).await;
    let spec = KernelSpec::default().tools(["echo", "nap"]);
    let code = "import os, tools\nprint(os.getuid())\ntools.echo(text=str(tools.nap(ms=1)))";
    let r = m
        .execute_with("conv", &spec, Cell::new(code))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Success, "{r:?}");
    let uid: u32 = r.stdout.trim().parse().unwrap();
    assert!(
        (200_000..=265_535).contains(&uid),
        "the kernel runs as its session's own uid: {uid}"
    );
    assert_eq!(r.value.as_deref(), Some("{'echo': '1'}"));
    assert_eq!(r.tool_calls_made, 2);
    let names: BTreeSet<String> = log.names().into_iter().collect();
    assert_eq!(names, ["echo".to_owned(), "nap".to_owned()].into());
    m.shutdown().await;
}
