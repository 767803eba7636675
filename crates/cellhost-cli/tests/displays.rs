//! `cellhost run` with rich outputs: images land in the display folder,
//! with real matplotlib, pillow and pandas (the test venv).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn venv_python() -> PathBuf {
    let path = match std::env::var_os("CELLHOST_TEST_VENV_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-test/bin/python"),
    };
    assert!(
        path.exists(),
        "the test venv is missing ({}); run scripts/test, which creates it",
        path.display()
    );
    path
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const SCRIPT: &str = "\
# %% a plot
import matplotlib.pyplot as plt
plt.plot([1, 2, 3])
plt.show()

# %% a table and an image
import pandas as pd
from PIL import Image
display(pd.DataFrame({'col': [7, 8]}))
Image.new('RGB', (12, 10))
";

#[test]
fn images_go_to_a_folder_next_to_the_script_and_their_paths_are_printed() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("plots.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let python = venv_python();
    let o = run(&[
        "run",
        "--python",
        python.to_str().unwrap(),
        script.to_str().unwrap(),
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let folder = dir.path().join("plots_displays");
    let plot = folder.join("cell1-1.png");
    let image = folder.join("cell2-2.png");
    assert!(
        out.contains(&format!("[image/png 640×480: {}]", plot.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!("[image/png 12×10: {}]", image.display())),
        "{out}"
    );
    assert_eq!(&std::fs::read(&plot).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&std::fs::read(&image).unwrap()[..4], b"\x89PNG");
    // The table's text form is printed; no file for it.
    assert!(out.contains("col\n0    7\n1    8"), "{out}");
    assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 2);
}

#[test]
fn json_output_keeps_displays_and_writes_files_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("p.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let python = venv_python();
    let python = python.to_str().unwrap();
    let o = run(&[
        "run",
        "--json",
        "--python",
        python,
        script.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let lines: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["displays"][0]["mime"], "image/png");
    assert_eq!(lines[0]["displays"][0]["display"], 0);
    assert!(lines[0]["displays"][0]["data"]
        .as_str()
        .unwrap()
        .starts_with("iVBORw0KGgo"));
    let mimes: Vec<_> = lines[1]["displays"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["display"].as_u64().unwrap(), d["mime"].as_str().unwrap()))
        .collect();
    assert_eq!(
        mimes,
        [
            (0, "text/html"),
            (0, "text/plain"),
            (1, "image/png"),
            (1, "text/plain")
        ]
    );
    assert!(!dir.path().join("p_displays").exists());

    let chosen = dir.path().join("chosen");
    let o = run(&[
        "run",
        "--json",
        "--display-dir",
        chosen.to_str().unwrap(),
        "--python",
        python,
        script.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(chosen.join("cell1-1.png").is_file());
    assert!(chosen.join("cell2-2.png").is_file());
}

#[test]
fn an_unwritable_display_folder_is_a_clear_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.py");
    std::fs::write(
        &script,
        "from PIL import Image\ndisplay(Image.new('L', (4, 4)))\nprint('ran')\n",
    )
    .unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "").unwrap();
    let python = venv_python();
    let o = run(&[
        "run",
        "--display-dir",
        blocker.join("sub").to_str().unwrap(),
        "--python",
        python.to_str().unwrap(),
        script.to_str().unwrap(),
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("ran\n"), "the cell still ran: {out}");
    assert!(
        out.contains("(display not saved: cannot save display 1 to ")
            && out.contains("choose a writable folder with --display-dir DIR"),
        "{out}"
    );
    assert!(!out.contains("panicked"), "{out}");
}
