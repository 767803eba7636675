//! Tenant scoping for every route, in one place.
//!
//! The auth layer (`auth`) puts the request's [`Caller`] in its
//! extensions; handlers take it as the [`Scope`] extractor and map the
//! session of the URL or body to the library's owner key with
//! [`Scope::key`], filter listings with [`Scope::sees`] / [`Scope::kernels`]
//! and show keys back with [`Scope::name_of`]. Nothing else builds owner
//! keys, so a tenant can only ever reach keys of its own namespace, and
//! another tenant's session answers exactly as one that does not exist.
//!
//! [`Gate`] enforces a tenant's `max_kernels`, `max_sessions` and
//! `max_cells_per_minute` when a cell is admitted (429 + `Retry-After`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;
use cellhost::history::{HistoryEntry, PageQuery};
use cellhost::owner::session_of;
pub(crate) use cellhost::tenant::Caller;
use cellhost::KernelSummary;

use crate::{ApiError, AppState};

/// The caller of a request, as the auth layer found it.
#[derive(Debug, Clone)]
pub(crate) struct Scope(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Scope {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Scope, ApiError> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .map(Scope)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "the request has no caller (the auth layer is missing)",
                )
            })
    }
}

impl Scope {
    /// The owner key of the session the caller names `session`.
    pub(crate) fn key(&self, session: &str) -> String {
        self.0.key(session)
    }

    /// What the caller calls owner `key` (`None`: not the caller's).
    pub(crate) fn name_of<'a>(&self, key: &'a str) -> Option<&'a str> {
        self.0.name_of(key)
    }

    pub(crate) fn sees(&self, key: &str) -> bool {
        self.0.sees(key)
    }

    /// The live kernels the caller may see, named as the caller names
    /// them.
    pub(crate) fn kernels(&self, state: &AppState) -> Vec<KernelSummary> {
        state
            .manager
            .list()
            .into_iter()
            .filter_map(|k| self.kernel(k))
            .collect()
    }

    /// One kernel as the caller sees it (`None`: not the caller's).
    pub(crate) fn kernel(&self, mut k: KernelSummary) -> Option<KernelSummary> {
        let name = self.name_of(&k.owner)?.to_owned();
        if let Some(rest) = k.key.strip_prefix(k.owner.as_str()) {
            k.key = format!("{name}{rest}");
        }
        k.owner = name;
        Some(k)
    }

    /// Scope a history query to the caller: its session named by key,
    /// and only its tenant's rows.
    pub(crate) fn history(&self, q: &mut PageQuery) {
        if let Some(s) = &q.session {
            q.session = Some(self.key(s));
        }
        q.tenant = self.0.tenant().map(str::to_owned);
    }

    /// A history row as the caller sees it (its session by name).
    pub(crate) fn row(&self, r: &mut HistoryEntry) {
        if let Some(name) = self.name_of(&r.session) {
            r.session = name.to_owned();
        }
    }
}

/// The tenant of an owner key, by name (`None`: the admin's own).
pub(crate) fn tenant_of<'a>(state: &'a AppState, key: &str) -> Option<&'a str> {
    state.options.tenants.tenant_of(key).map(|t| &*t.name)
}

/// How long a client is asked to wait when a kernel or session limit is
/// reached (kernels go when disposed or reaped).
const LIMIT_RETRY_SECONDS: u64 = 5;

/// Per-tenant admission: cells started in the last minute, and owners
/// with a cell admitted but maybe no kernel yet (so two cells at once
/// cannot both start the kernel over the limit).
#[derive(Default, Clone)]
pub(crate) struct Gate(Arc<Mutex<HashMap<String, TenantState>>>);

#[derive(Default)]
struct TenantState {
    started: VecDeque<Instant>,
    pending: HashMap<String, usize>,
}

/// Held while an admitted cell is in flight.
pub(crate) struct Admitted {
    gate: Gate,
    tenant: String,
    owner: String,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut all = self.gate.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = all.get_mut(&self.tenant) {
            if let Some(n) = t.pending.get_mut(&self.owner) {
                *n -= 1;
                if *n == 0 {
                    t.pending.remove(&self.owner);
                }
            }
        }
    }
}

fn too_many(what: String, retry: u64) -> ApiError {
    ApiError::new(StatusCode::TOO_MANY_REQUESTS, "tenant_limit", what).retry_after(retry)
}

impl Gate {
    /// Admit a cell of owner `owner` (in session key `session`), or say
    /// which of its tenant's limits it would pass. The admin's own
    /// sessions have no limits.
    pub(crate) fn admit(
        &self,
        state: &AppState,
        owner: &str,
    ) -> Result<Option<Admitted>, ApiError> {
        let Some(tenant) = state.options.tenants.tenant_of(owner) else {
            return Ok(None);
        };
        let limits = tenant.limits;
        let name = tenant.name.to_string();
        let live = state.manager.list();
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let t = all.entry(name.clone()).or_default();
        let now = Instant::now();
        while t
            .started
            .front()
            .is_some_and(|s| now.duration_since(*s) >= Duration::from_secs(60))
        {
            t.started.pop_front();
        }
        if let Some(max) = limits.max_cells_per_minute {
            if t.started.len() >= max as usize {
                let wait = t.started.front().map_or(60, |s| {
                    60u64
                        .saturating_sub(now.duration_since(*s).as_secs())
                        .max(1)
                });
                return Err(too_many(
                    format!(
                        "tenant {name:?} has started {max} cells in the last minute, its \
                         max_cells_per_minute; retry in {wait} s"
                    ),
                    wait,
                ));
            }
        }
        let mine = |o: &str| {
            state
                .options
                .tenants
                .tenant_of(o)
                .is_some_and(|x| *x.name == *name)
        };
        let kernels: Vec<&str> = live
            .iter()
            .map(|k| k.owner.as_str())
            .filter(|o| mine(o))
            .collect();
        let owners: HashSet<&str> = kernels
            .iter()
            .copied()
            .chain(t.pending.keys().map(String::as_str))
            .collect();
        let new_owner = !owners.contains(owner);
        let sessions: HashSet<&str> = owners.iter().map(|o| session_of(o)).collect();
        if let Some(max) = limits.max_sessions {
            if !sessions.contains(session_of(owner)) && sessions.len() >= max {
                return Err(too_many(
                    format!(
                        "tenant {name:?} has {max} sessions with live kernels, its \
                         max_sessions; dispose one (DELETE /v1/sessions/{{session}}) or wait \
                         for idle ones to be reaped"
                    ),
                    LIMIT_RETRY_SECONDS,
                ));
            }
        }
        if let (Some(max), true) = (limits.max_kernels, new_owner) {
            let pending_new = t
                .pending
                .keys()
                .filter(|o| !kernels.contains(&o.as_str()))
                .count();
            if kernels.len() + pending_new >= max {
                return Err(too_many(
                    format!(
                        "tenant {name:?} has {max} live kernels, its max_kernels; dispose a \
                         session (DELETE /v1/sessions/{{session}}) or wait for idle ones to be \
                         reaped"
                    ),
                    LIMIT_RETRY_SECONDS,
                ));
            }
        }
        t.started.push_back(now);
        *t.pending.entry(owner.to_owned()).or_default() += 1;
        Ok(Some(Admitted {
            gate: self.clone(),
            tenant: name,
            owner: owner.to_owned(),
        }))
    }
}
