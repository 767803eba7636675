//! The dialect's transform leaves valid Python alone: random programs full
//! of `%` and `!` that are not escapes (`a % b`, `x != y`, `"%d" % n`,
//! `!r` conversions, comments, comprehensions, continuation lines and
//! multi-line strings whose lines start with `!` or `%`) come out
//! unchanged, an escape inserted at a real statement start is transformed
//! on that line only, and a sample of the programs gives the same
//! namespace in a real kernel as under plain `exec`.
//!
//! The generator is tests/dialect_property.py (run by the test venv's
//! Python); `DIALECT_SEED` replays a seed, `PROPTEST_CASES` scales it.
mod common;

use std::path::Path;
use std::process::Command;

use cellhost::{Cell, Status};
use common::*;

fn script() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/dialect_property.py"
    ))
}

fn dialect_source() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/runner/dialect.py"
    ))
}

fn seed() -> u64 {
    match std::env::var("DIALECT_SEED") {
        Ok(s) => s.parse().expect("DIALECT_SEED is a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64,
    }
}

fn cases(default: u64) -> u64 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse::<u64>().ok())
        .map_or(default, |c| (c * 8).max(100))
}

#[test]
fn the_transform_leaves_random_valid_python_unchanged() {
    let seed = seed();
    let out = Command::new(venv_python())
        .arg(script())
        .arg(dialect_source())
        .args(["check", &cases(2000).to_string(), &seed.to_string()])
        .output()
        .expect("the test venv's python runs");
    assert!(
        out.status.success(),
        "seed {seed} (replay with DIALECT_SEED={seed}):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn random_valid_python_leaves_the_same_namespace_in_a_kernel() {
    let seed = seed();
    let out = Command::new(venv_python())
        .arg(script())
        .arg(dialect_source())
        .args(["sample", "30", &seed.to_string()])
        .output()
        .expect("the test venv's python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<(String, String)> = serde_json::from_slice(&out.stdout).unwrap();
    let fingerprint = "print(repr(sorted((k, repr(v)) for k, v in dict(globals()).items() \
                       if not k.startswith('_') and k != 'display')))";
    let clear = "for _k in [k for k in globals() if not k.startswith('_')]:\n    del globals()[_k]";
    let k = kernel().await;
    for (program, expected) in samples {
        assert_eq!(k.run(clear).await.status, Status::Success);
        let r = k.run_cell(Cell::new(program.clone())).await;
        assert_eq!(
            r.status,
            Status::Success,
            "seed {seed}: the kernel failed a program plain exec runs:\n{program}\n{r:?}"
        );
        let r = k.run(fingerprint).await;
        assert_eq!(
            r.stdout.trim_end(),
            expected,
            "seed {seed}: another namespace in the kernel for:\n{program}"
        );
    }
}
