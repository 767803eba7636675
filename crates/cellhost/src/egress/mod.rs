//! Egress through an allow-list (`[sandbox] network = "allowlist"`): a
//! strict kernel has no network of its own; its only way out is the host's
//! HTTP proxy (`proxy.rs`) reached over a Unix socket bound into the
//! sandbox, offered inside as `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY` on the
//! sandbox's loopback (the runner forwards that port to the socket). The
//! policy (`policy.rs`) admits host names on the list, resolved by the
//! host, and never an address of the host's own networks.

mod policy;
pub(crate) mod proxy;

use std::sync::atomic::{AtomicU64, Ordering};

pub use policy::{Cidr, EgressPolicy};

/// Proxy decisions since the process started.
pub(crate) struct Counts {
    pub allowed: AtomicU64,
    pub refused: AtomicU64,
}

pub(crate) static COUNTS: Counts = Counts {
    allowed: AtomicU64::new(0),
    refused: AtomicU64::new(0),
};

/// `(allowed, refused)` egress proxy decisions since start (for metrics).
pub fn decisions() -> (u64, u64) {
    (
        COUNTS.allowed.load(Ordering::Relaxed),
        COUNTS.refused.load(Ordering::Relaxed),
    )
}
