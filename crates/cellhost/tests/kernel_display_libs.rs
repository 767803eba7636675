//! Rich outputs from real libraries (the test venv): matplotlib figures
//! (left open, plt.show(), savefig, as a value, a hundred of them, the
//! backend), PIL images and pandas DataFrames.

mod common;

use cellhost::DisplayLimits;
use common::display::{count, item, ok, png_size, venv_kernel, venv_kernel_with};
use common::{kernel_with, options, venv_python};

#[tokio::test]
async fn a_line_plot_left_open_arrives_as_a_png_and_is_closed() {
    let k = venv_kernel().await;
    let r = k
        .run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('line')\nx = 1")
        .await;
    ok(&r);
    assert_eq!(count(&r), 1, "{:#?}", r.displays);
    assert_eq!(png_size(item(&r, 0, "image/png")), (640, 480));
    assert!(item(&r, 0, "text/plain")
        .data
        .starts_with("<Figure size 640x480"));
    let r = k
        .run("import matplotlib, os\nprint(plt.get_fignums(), matplotlib.get_backend().lower(), 'MPLBACKEND' in os.environ)")
        .await;
    assert_eq!(
        r.stdout, "[] agg False\n",
        "Agg, and the environment stays clean"
    );
    assert!(r.displays.is_empty());
}

#[tokio::test]
async fn plt_show_captures_every_open_figure_in_order_then_closes_them() {
    let k = venv_kernel().await;
    let r = k
        .run(
            "import matplotlib.pyplot as plt\n\
             display('before')\n\
             plt.figure(figsize=(2, 1)); plt.plot([1, 2])\n\
             plt.figure(figsize=(3, 2)); plt.bar([1, 2], [3, 4])\n\
             plt.show()\n\
             print(plt.get_fignums())\n\
             display('after')",
        )
        .await;
    ok(&r);
    assert_eq!(r.stdout, "[]\n");
    assert!(
        r.stderr.is_empty(),
        "no non-interactive warning: {}",
        r.stderr
    );
    assert_eq!(count(&r), 4);
    assert_eq!(item(&r, 0, "text/plain").data, "'before'");
    assert_eq!(png_size(item(&r, 1, "image/png")), (200, 100));
    assert_eq!(png_size(item(&r, 2, "image/png")), (300, 200));
    assert_eq!(item(&r, 3, "text/plain").data, "'after'");
}

#[tokio::test]
async fn savefig_still_writes_its_file() {
    let k = venv_kernel().await;
    let path = k.dir.path().join("out.png");
    let r = k
        .run(&format!(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.savefig({:?})",
            path.to_str().unwrap()
        ))
        .await;
    ok(&r);
    assert_eq!(&std::fs::read(&path).unwrap()[..4], b"\x89PNG");
    assert_eq!(count(&r), 1, "the open figure is still shown");
}

#[tokio::test]
async fn a_figure_as_the_last_value_is_shown_once() {
    let k = venv_kernel().await;
    let r = k
        .run("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2])\nfig")
        .await;
    ok(&r);
    assert!(r
        .value
        .as_deref()
        .unwrap()
        .starts_with("<Figure size 640x480"));
    assert_eq!(count(&r), 1, "{:#?}", r.displays);
    png_size(item(&r, 0, "image/png"));
}

#[tokio::test]
async fn display_of_a_pil_image_is_a_png_of_its_size() {
    let k = venv_kernel().await;
    let r = k
        .run("from PIL import Image\ndisplay(Image.new('RGB', (30, 20), 'red'))")
        .await;
    ok(&r);
    assert_eq!(count(&r), 1);
    assert_eq!(png_size(item(&r, 0, "image/png")), (30, 20));
    assert!(item(&r, 0, "text/plain").data.contains("PIL.Image.Image"));
    assert!(
        !r.displays.iter().any(|d| d.mime == "image/jpeg"),
        "one raster image per display"
    );
}

#[tokio::test]
async fn a_dataframe_is_an_html_table_with_a_text_fallback() {
    let k = venv_kernel().await;
    let r = k
        .run("import pandas as pd\ndf = pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})\ndisplay(df)\ndf")
        .await;
    ok(&r);
    assert_eq!(count(&r), 2, "display(df) and the last value");
    for n in 0..2 {
        let html = &item(&r, n, "text/html").data;
        assert!(
            html.contains("<table") && html.contains("<td>x</td>"),
            "{html}"
        );
        let text = &item(&r, n, "text/plain").data;
        assert!(text.contains('a') && text.contains('y'), "{text}");
    }
    assert_eq!(
        r.value.as_deref(),
        Some(item(&r, 1, "text/plain").data.as_str())
    );
}

#[tokio::test]
async fn a_display_over_the_per_display_cap_is_dropped_with_a_note() {
    let k = venv_kernel_with(DisplayLimits {
        max_display_bytes: 20_000,
        ..DisplayLimits::default()
    })
    .await;
    let r = k
        .run(
            "import numpy as np, matplotlib.pyplot as plt\n\
             plt.imshow(np.random.default_rng(0).random((400, 400)))\n\
             display('small')",
        )
        .await;
    ok(&r);
    assert_eq!(count(&r), 1, "only the small display is kept");
    assert_eq!(item(&r, 0, "text/plain").data, "'small'");
    assert_eq!(r.truncated.displays_dropped, 1);
    let note = r.truncated.displays_note.as_deref().unwrap();
    assert!(
        note.starts_with("1 display dropped: a display (image/png) of ")
            && note.contains("over the per-display cap of 19.5 KiB"),
        "{note}"
    );
}

#[tokio::test]
async fn a_cell_that_creates_a_hundred_figures_shows_them_all() {
    let k = venv_kernel().await;
    let r = k
        .run(
            "import matplotlib.pyplot as plt\n\
             for i in range(100):\n\
             \x20   plt.figure(figsize=(1, 1), dpi=50); plt.plot([0, i])\n\
             len(plt.get_fignums())",
        )
        .await;
    ok(&r);
    assert_eq!(r.value.as_deref(), Some("100"));
    assert_eq!(count(&r), 100);
    for n in 0..100 {
        assert_eq!(png_size(item(&r, n, "image/png")), (50, 50));
    }
    let r = k.run("len(plt.get_fignums())").await;
    assert_eq!(r.value.as_deref(), Some("0"));
}

#[tokio::test]
async fn a_backend_the_operator_passes_through_is_kept() {
    use std::ffi::OsString;
    let dir = tempfile::tempdir().unwrap();
    let vars = vec![
        (OsString::from("PATH"), std::env::var_os("PATH").unwrap()),
        (OsString::from("MPLBACKEND"), OsString::from("svg")),
    ];
    let env = cellhost::env::ChildEnv::from_vars(vars, &["MPLBACKEND".into()]);
    let k = kernel_with(options(&dir).python(venv_python()).env(env), dir).await;
    let r = k
        .run("import os, matplotlib\nprint(matplotlib.get_backend(), os.environ['MPLBACKEND'])")
        .await;
    ok(&r);
    assert_eq!(r.stdout, "svg svg\n");
}
