//! Helpers shared by the CLI's integration tests.

pub(crate) mod daemon;
pub(crate) mod python;
