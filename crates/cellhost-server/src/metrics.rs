//! `GET /metrics`: Prometheus text format. Counters are atomics bumped
//! when a cell settles; kernel figures are read from the manager at
//! scrape time.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use cellhost::{CellResult, Status};

use crate::tenant::Scope;
use crate::AppState;

/// Upper bounds (seconds) of the cell-duration histogram's buckets.
const BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 300.0,
];

const STATUSES: [Status; 4] = [
    Status::Success,
    Status::Error,
    Status::Timeout,
    Status::Interrupted,
];

#[derive(Debug, Default)]
pub(crate) struct Metrics {
    cells: [AtomicU64; 4],
    /// Requests whose cell could not run at all (no kernel, shutting down).
    failed: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
    duration_micros: AtomicU64,
    tool_calls: AtomicU64,
    state_lost: AtomicU64,
    /// Per-tenant counts, by tenant name.
    tenants: std::sync::Mutex<std::collections::BTreeMap<String, TenantCounts>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct TenantCounts {
    cells: [u64; 4],
    failed: u64,
    refused: u64,
}

impl Metrics {
    fn tenant(&self, tenant: Option<&str>, f: impl FnOnce(&mut TenantCounts)) {
        if let Some(t) = tenant {
            let mut all = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
            f(all.entry(t.to_owned()).or_default());
        }
    }

    pub(crate) fn record(&self, r: &CellResult, tenant: Option<&str>) {
        let i = STATUSES.iter().position(|s| *s == r.status).unwrap_or(1);
        self.cells[i].fetch_add(1, Ordering::Relaxed);
        self.tenant(tenant, |t| t.cells[i] += 1);
        let d = r.duration_seconds.max(0.0);
        if let Some(b) = BUCKETS.iter().position(|&le| d <= le) {
            self.buckets[b].fetch_add(1, Ordering::Relaxed);
        }
        self.duration_micros
            .fetch_add((d * 1e6) as u64, Ordering::Relaxed);
        self.tool_calls
            .fetch_add(r.tool_calls_made, Ordering::Relaxed);
        if r.kernel.state_lost {
            self.state_lost.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn failed(&self, tenant: Option<&str>) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        self.tenant(tenant, |t| t.failed += 1);
    }

    /// A tenant's cell refused by one of its limits (429).
    pub(crate) fn refused(&self, tenant: Option<&str>) {
        self.tenant(tenant, |t| t.refused += 1);
    }
}

/// The per-tenant families (`tenant` label), for the tenants `scope` sees.
fn tenant_families(out: &mut String, state: &AppState, scope: &Scope) {
    let tenants = &state.options.tenants;
    if tenants.is_empty() {
        return;
    }
    let names: Vec<&str> = tenants
        .iter()
        .map(|t| &*t.name)
        .filter(|t| scope.0.tenant().is_none_or(|mine| mine == *t))
        .collect();
    let counts = state
        .metrics
        .tenants
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let kernels = state.manager.list();
    let of = |t: &str| -> Vec<&cellhost::KernelSummary> {
        kernels
            .iter()
            .filter(|k| tenants.tenant_of(&k.owner).is_some_and(|x| &*x.name == t))
            .collect()
    };
    family(
        out,
        "cellhost_tenant_kernels_live",
        "gauge",
        "Live kernels of each tenant.",
    );
    for t in &names {
        let _ = writeln!(
            out,
            "cellhost_tenant_kernels_live{{tenant=\"{t}\"}} {}",
            of(t).len()
        );
    }
    family(
        out,
        "cellhost_tenant_sessions_live",
        "gauge",
        "Sessions with live kernels of each tenant.",
    );
    for t in &names {
        let sessions: std::collections::HashSet<&str> = of(t)
            .iter()
            .map(|k| cellhost::owner::session_of(&k.owner))
            .collect();
        let _ = writeln!(
            out,
            "cellhost_tenant_sessions_live{{tenant=\"{t}\"}} {}",
            sessions.len()
        );
    }
    family(
        out,
        "cellhost_tenant_cells_total",
        "counter",
        "Cells run by each tenant, by how they ended.",
    );
    for t in &names {
        let c = counts.get(*t).copied().unwrap_or_default();
        for (s, n) in STATUSES.iter().zip(c.cells) {
            let _ = writeln!(
                out,
                "cellhost_tenant_cells_total{{tenant=\"{t}\",status=\"{}\"}} {n}",
                s.as_str()
            );
        }
    }
    for (name, help, pick) in [
        (
            "cellhost_tenant_cells_failed_to_run_total",
            "Cells of each tenant that could not run (no kernel could start, shutting down).",
            (|c: &TenantCounts| c.failed) as fn(&TenantCounts) -> u64,
        ),
        (
            "cellhost_tenant_cells_refused_total",
            "Cells of each tenant refused by its limits (429).",
            |c: &TenantCounts| c.refused,
        ),
    ] {
        family(out, name, "counter", help);
        for t in &names {
            let c = counts.get(*t).copied().unwrap_or_default();
            let _ = writeln!(out, "{name}{{tenant=\"{t}\"}} {}", pick(&c));
        }
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The daemon's metrics. A tenant sees only its own per-tenant families;
/// the admin sees everything.
pub(crate) async fn render(State(state): State<AppState>, scope: Scope) -> impl IntoResponse {
    if scope.0.tenant().is_some() {
        let mut out = String::new();
        tenant_families(&mut out, &state, &scope);
        return ([(header::CONTENT_TYPE, TEXT)], out);
    }
    let m = &state.metrics;
    let kernels = state.manager.list();
    let stats = state.manager.stats();
    let mut out = String::with_capacity(4096);
    family(
        &mut out,
        "cellhost_kernels_live",
        "gauge",
        "Live owned kernels.",
    );
    let _ = writeln!(out, "cellhost_kernels_live {}", kernels.len());
    family(
        &mut out,
        "cellhost_kernels_busy",
        "gauge",
        "Kernels running or queueing a cell.",
    );
    let busy = kernels
        .iter()
        .filter(|k| k.state == cellhost::KernelState::Busy)
        .count();
    let _ = writeln!(out, "cellhost_kernels_busy {busy}");
    family(
        &mut out,
        "cellhost_kernels_pooled",
        "gauge",
        "Warm unowned kernels waiting in the pool.",
    );
    let _ = writeln!(out, "cellhost_kernels_pooled {}", state.manager.pooled());
    family(
        &mut out,
        "cellhost_cells_in_flight",
        "gauge",
        "Cells running now.",
    );
    let _ = writeln!(
        out,
        "cellhost_cells_in_flight {}",
        state.in_flight.load(Ordering::Relaxed)
    );
    family(
        &mut out,
        "cellhost_cells_total",
        "counter",
        "Cells run, by how they ended.",
    );
    for (s, n) in STATUSES.iter().zip(&m.cells) {
        let _ = writeln!(
            out,
            "cellhost_cells_total{{status=\"{}\"}} {}",
            s.as_str(),
            n.load(Ordering::Relaxed)
        );
    }
    family(
        &mut out,
        "cellhost_cells_failed_to_run_total",
        "counter",
        "Requests whose cell could not run (no kernel could start, shutting down).",
    );
    let _ = writeln!(
        out,
        "cellhost_cells_failed_to_run_total {}",
        m.failed.load(Ordering::Relaxed)
    );
    family(
        &mut out,
        "cellhost_cells_state_lost_total",
        "counter",
        "Cells whose result says the kernel's state was lost.",
    );
    let _ = writeln!(
        out,
        "cellhost_cells_state_lost_total {}",
        m.state_lost.load(Ordering::Relaxed)
    );
    family(
        &mut out,
        "cellhost_cell_duration_seconds",
        "histogram",
        "Cell duration as reported in results.",
    );
    let mut cumulative = 0;
    for (le, n) in BUCKETS.iter().zip(&m.buckets) {
        cumulative += n.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "cellhost_cell_duration_seconds_bucket{{le=\"{le}\"}} {cumulative}"
        );
    }
    let count: u64 = m.cells.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    let _ = writeln!(
        out,
        "cellhost_cell_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
    );
    let _ = writeln!(
        out,
        "cellhost_cell_duration_seconds_sum {}",
        m.duration_micros.load(Ordering::Relaxed) as f64 / 1e6
    );
    let _ = writeln!(out, "cellhost_cell_duration_seconds_count {count}");
    for (name, help, v) in [
        (
            "cellhost_kernel_spawns_total",
            "Kernel processes started (pool included).",
            stats.spawns,
        ),
        (
            "cellhost_kernel_pool_hits_total",
            "Owners served from the warm pool.",
            stats.pool_hits,
        ),
        (
            "cellhost_kernel_evictions_total",
            "Kernels evicted by the LRU cap.",
            stats.evictions,
        ),
        (
            "cellhost_kernel_reaps_total",
            "Idle kernels reaped.",
            stats.reaps,
        ),
        (
            "cellhost_kernel_disposals_total",
            "Kernels killed by session/child disposal.",
            stats.disposals,
        ),
        (
            "cellhost_tool_calls_total",
            "Tool calls made by cells.",
            m.tool_calls.load(Ordering::Relaxed),
        ),
        (
            "cellhost_egress_allowed_total",
            "Connections the egress proxy let through (network = allowlist).",
            cellhost::egress::decisions().0,
        ),
        (
            "cellhost_egress_refused_total",
            "Requests the egress proxy refused (network = allowlist).",
            cellhost::egress::decisions().1,
        ),
        (
            "cellhost_history_write_failures_total",
            "Cells whose history row could not be committed (a full disk).",
            state
                .history
                .as_ref()
                .map_or(0, |h| h.health().write_failures),
        ),
        (
            "cellhost_connections_accepted_total",
            "TCP connections accepted.",
            state.conns.accepted.load(Ordering::Relaxed),
        ),
        (
            "cellhost_connections_refused_total",
            "Connections closed at once past [server] max_connections(_per_peer).",
            state.conns.refused.load(Ordering::Relaxed),
        ),
        (
            "cellhost_connections_header_timeouts_total",
            "Connections closed for not sending a request's headers in time.",
            state.conns.header_timeouts.load(Ordering::Relaxed),
        ),
        (
            "cellhost_connections_idle_timeouts_total",
            "Kept-alive connections closed after the idle timeout.",
            state.conns.idle_timeouts.load(Ordering::Relaxed),
        ),
        (
            "cellhost_connections_write_timeouts_total",
            "Connections closed because the client read nothing of a response.",
            state.conns.write_timeouts.load(Ordering::Relaxed),
        ),
    ] {
        family(&mut out, name, "counter", help);
        let _ = writeln!(out, "{name} {v}");
    }
    family(
        &mut out,
        "cellhost_connections_open",
        "gauge",
        "Open client connections.",
    );
    let _ = writeln!(
        out,
        "cellhost_connections_open {}",
        state.conns.open.load(Ordering::Relaxed)
    );
    family(
        &mut out,
        "cellhost_history_degraded",
        "gauge",
        "1 while the latest history write failed.",
    );
    let degraded = state
        .history
        .as_ref()
        .is_some_and(|h| h.health().failing.is_some());
    let _ = writeln!(out, "cellhost_history_degraded {}", u8::from(degraded));
    tenant_families(&mut out, &state, &scope);
    ([(header::CONTENT_TYPE, TEXT)], out)
}
