//! Error messages name their own layer only: a cause is a `#[source]`,
//! printed once by [`crate::error_chain`], never also in the message.

use std::error::Error;
use std::io;
use std::path::PathBuf;

use crate::files::FileError;
use crate::history::HistoryError;
use crate::registry::ManagerError;
use crate::sandbox::SandboxError;
use crate::{KernelError, SpawnError};

fn io_cause() -> io::Error {
    io::Error::other("the disk caught fire")
}

/// Every error with a source, as its users meet them.
fn errors() -> Vec<Box<dyn Error + 'static>> {
    let spawn_io = || SpawnError::Io {
        about: "create the staging dir",
        err: io_cause(),
    };
    let workspace = || SandboxError::Workspace {
        path: PathBuf::from("/w"),
        err: io_cause(),
    };
    vec![
        Box::new(spawn_io()),
        Box::new(SpawnError::Exec {
            python: PathBuf::from("/usr/bin/python3"),
            err: io_cause(),
        }),
        Box::new(SpawnError::Sandbox(workspace())),
        Box::new(KernelError::Spawn(spawn_io())),
        Box::new(ManagerError::Kernel(KernelError::Spawn(spawn_io()))),
        Box::new(workspace()),
        Box::new(SandboxError::Io {
            about: "write the seccomp filter",
            err: io_cause(),
        }),
        Box::new(FileError::Body(io_cause())),
        Box::new(FileError::Io {
            about: "read the file",
            err: io_cause(),
        }),
        Box::new(HistoryError::Dir {
            path: PathBuf::from("/h"),
            source: io_cause(),
        }),
    ]
}

#[test]
fn no_error_message_repeats_its_source() {
    for e in errors() {
        let mut at: &(dyn Error + 'static) = &*e;
        while let Some(source) = at.source() {
            let (own, cause) = (at.to_string(), source.to_string());
            assert!(
                !own.contains(&cause),
                "{own:?} repeats its source {cause:?} (chain: {:?})",
                crate::error_chain(&*e)
            );
            at = source;
        }
    }
}

#[test]
fn the_chain_still_carries_the_cause_once() {
    let e = ManagerError::Kernel(KernelError::Spawn(SpawnError::Exec {
        python: PathBuf::from("/usr/bin/python3"),
        err: io_cause(),
    }));
    assert_eq!(
        crate::error_chain(&e),
        "failed to start a kernel: failed to start /usr/bin/python3: the disk caught fire"
    );
}
