//! The Kernel Gateway REST API under `/api`: version, kernelspecs,
//! kernels (a kernel is a cellhost session) and sessions, with the
//! models Jupyter Server's `GatewayClient` reads (`id`, `name`,
//! `last_activity`, `execution_state`, `connections`).
//!
//! A kernel is started lazily: `POST /api/kernels` registers it and its
//! process starts with its first request (cellhost starts kernels on
//! first use, from a warm pool when there is one). Restart disposes the
//! session's kernels; the next cell gets a fresh process.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cellhost::registry::{belongs_to_session, is_child, validate_owner};
use cellhost_protocol::KernelState;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{iso_time, messages, Jupyter};
use crate::tenant::Scope;
use crate::ApiError;

/// The one kernelspec: the daemon's Python interpreter.
pub(crate) const SPEC_NAME: &str = "python3";
/// Most Jupyter kernels registered at once (each holds a hub and a task
/// until deleted), so a client looping on `POST /api/kernels` cannot
/// grow the daemon without bound.
const MAX_KERNELS: usize = 4096;

fn path_error(r: PathRejection) -> ApiError {
    ApiError::bad_request("bad_path", format!("the URL path could not be read: {r}"))
}

fn unknown_kernel(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_kernel",
        format!(
            "no kernel {id:?} is known here; start one with POST /api/kernels \
             (a cellhost session id may be named there as \"id\")"
        ),
    )
}

/// `GET /api`.
pub(crate) async fn version() -> Json<Value> {
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "gateway": "cellhost",
        "kernel_gateway": "compatible",
    }))
}

fn spec_model() -> Value {
    json!({
        "name": SPEC_NAME,
        "spec": {
            "argv": [],
            "display_name": "Python 3 (cellhost)",
            "language": "python",
            "interrupt_mode": "message",
            "env": {},
            "metadata": {"cellhost": true},
        },
        "resources": {},
    })
}

/// `GET /api/kernelspecs`.
pub(crate) async fn kernelspecs() -> Json<Value> {
    Json(json!({
        "default": SPEC_NAME,
        "kernelspecs": { SPEC_NAME: spec_model() },
    }))
}

/// `GET /api/kernelspecs/{name}`.
pub(crate) async fn kernelspec(
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(name) = name.map_err(path_error)?;
    if name != SPEC_NAME {
        return Err(unknown_spec(&name));
    }
    Ok(Json(spec_model()))
}

fn unknown_spec(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_kernelspec",
        format!("no kernelspec {name:?}; cellhost offers {SPEC_NAME:?} (GET /api/kernelspecs)"),
    )
}

impl Jupyter {
    /// The kernel model of owner key `id` as `scope` names it, if it is
    /// known (a hub, or a live session) and the caller's.
    pub(crate) fn model(&self, scope: &Scope, id: &str) -> Option<Value> {
        let name = scope.name_of(id)?;
        let live: Vec<_> = self
            .app
            .manager
            .list()
            .into_iter()
            .filter(|k| k.owner == id)
            .collect();
        let hub = self.hub(id);
        if hub.is_none() && live.is_empty() {
            return None;
        }
        let busy = hub
            .as_ref()
            .is_some_and(|h| h.shared.busy.load(std::sync::atomic::Ordering::SeqCst))
            || live.iter().any(|k| k.state == KernelState::Busy);
        let starting = live.iter().any(|k| k.state == KernelState::Starting);
        let last = live
            .iter()
            .map(|k| k.last_used)
            .chain(hub.as_ref().map(|h| h.shared.last_activity()))
            .fold(0.0_f64, f64::max);
        Some(json!({
            "id": name,
            "name": hub.as_ref().map_or(SPEC_NAME, |h| h.shared.name.as_str()),
            "last_activity": iso_time(last),
            "execution_state": if busy { "busy" } else if starting { "starting" } else { "idle" },
            "connections": hub.as_ref().map_or(0, |h| h.shared.connections()),
        }))
    }

    /// Every kernel the caller sees (owner keys): the hubs and the live
    /// sessions (not children).
    fn all_ids(&self, scope: &Scope) -> Vec<String> {
        let mut ids: Vec<String> = self
            .hubs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        for k in self.app.manager.list() {
            if !is_child(&k.owner) && !ids.contains(&k.owner) {
                ids.push(k.owner);
            }
        }
        ids.retain(|id| scope.sees(id));
        ids.sort();
        ids
    }

    /// Register kernel `id` (the caller's name for it; new when `None`)
    /// as spec `name`.
    fn start(
        &self,
        scope: &Scope,
        id: Option<String>,
        name: Option<&str>,
    ) -> Result<Value, ApiError> {
        let name = name.filter(|n| !n.is_empty()).unwrap_or(SPEC_NAME);
        if name != SPEC_NAME {
            return Err(unknown_spec(name));
        }
        if self.app.manager.is_shut_down() {
            return Err(cellhost::registry::ManagerError::ShutDown.into());
        }
        let id = id.unwrap_or_else(super::new_uuid);
        validate_owner(&id).map_err(|e| ApiError::bad_request("invalid_session", e.to_string()))?;
        let id = scope.key(&id);
        if is_child(&id) {
            return Err(ApiError::bad_request(
                "invalid_session",
                "a delegated child's kernel cannot be a Jupyter kernel; name its parent session",
            ));
        }
        if self.hub(&id).is_none()
            && self.hubs.lock().unwrap_or_else(|e| e.into_inner()).len() >= MAX_KERNELS
        {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_kernels",
                format!(
                    "{MAX_KERNELS} Jupyter kernels are registered; delete some                      (DELETE /api/kernels/{{id}}) before starting more"
                ),
            ));
        }
        if let (None, Some(t)) = (self.hub(&id), self.app.options.tenants.tenant_of(&id)) {
            // A registered kernel holds a hub until deleted: a tenant may
            // register as many as its max_sessions.
            if let Some(max) = t.limits.max_sessions {
                let prefix = format!("{}{}", t.name, cellhost::tenant::SEPARATOR);
                let mine = self
                    .hubs
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .keys()
                    .filter(|k| k.starts_with(&prefix))
                    .count();
                if mine >= max {
                    return Err(ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        "tenant_limit",
                        format!(
                            "tenant {:?} has {max} Jupyter kernels registered, its \
                             max_sessions; delete one (DELETE /api/kernels/{{id}}) first",
                            t.name
                        ),
                    )
                    .retry_after(5));
                }
            }
        }
        self.hub_or_new(&id, name);
        Ok(self
            .model(scope, &id)
            .unwrap_or_else(|| json!({ "id": scope.name_of(&id) })))
    }

    /// Dispose of `id`'s kernels; `forget`: also its hub and sockets.
    async fn dispose(&self, id: &str, forget: bool) -> bool {
        let live = self
            .app
            .manager
            .list()
            .iter()
            .any(|k| belongs_to_session(&k.owner, id));
        let known = live || self.hub(id).is_some();
        self.app.manager.dispose_owner(id).await;
        crate::execute::forget_previous(&self.app, id);
        if forget {
            self.remove(id);
        }
        known
    }
}

/// The body of `POST /api/kernels`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct StartKernel {
    #[serde(default)]
    name: Option<String>,
    /// An existing cellhost session to attach to.
    #[serde(default)]
    id: Option<String>,
    /// `KERNEL_ID` names the kernel (as in Enterprise Gateway); other
    /// entries are ignored (kernels get the daemon's environment rules).
    #[serde(default)]
    env: HashMap<String, Value>,
}

fn parse_body<T: for<'de> Deserialize<'de> + Default>(
    body: Result<Bytes, BytesRejection>,
    example: &str,
) -> Result<T, ApiError> {
    let body = body.map_err(|r| {
        ApiError::bad_request(
            "bad_body",
            format!("the request body could not be read: {r}"),
        )
    })?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "invalid_request",
            format!("the request body is not valid ({e}); send JSON like {example}"),
        )
    })
}

/// `GET /api/kernels`.
pub(crate) async fn list_kernels(State(j): State<Jupyter>, scope: Scope) -> Json<Value> {
    let models: Vec<Value> = j
        .all_ids(&scope)
        .iter()
        .filter_map(|id| j.model(&scope, id))
        .collect();
    Json(Value::Array(models))
}

/// `POST /api/kernels`: 201 with the model.
pub(crate) async fn start_kernel(
    State(j): State<Jupyter>,
    scope: Scope,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let start = parse_body::<StartKernel>(body, r#"{"name": "python3"}"#).and_then(|b| {
        let id = b.id.or_else(|| {
            b.env
                .get("KERNEL_ID")
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        j.start(&scope, id, b.name.as_deref())
    });
    match start {
        Ok(model) => created(model, "kernels"),
        Err(e) => e.into_response(),
    }
}

fn created(model: Value, what: &str) -> Response {
    let location = format!("/api/{what}/{}", model["id"].as_str().unwrap_or(""));
    let mut resp = (StatusCode::CREATED, Json(model)).into_response();
    if let Ok(v) = header::HeaderValue::from_str(&location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

/// `GET /api/kernels/{id}`.
pub(crate) async fn get_kernel(
    State(j): State<Jupyter>,
    scope: Scope,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = id.map_err(path_error)?;
    j.model(&scope, &scope.key(&id))
        .map(Json)
        .ok_or_else(|| unknown_kernel(&id))
}

/// `DELETE /api/kernels/{id}`: the session's kernels go (its history
/// stays), its sockets close. 204.
pub(crate) async fn delete_kernel(
    State(j): State<Jupyter>,
    scope: Scope,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Path(id) = id.map_err(path_error)?;
    let key = scope.key(&id);
    if !j.dispose(&key, true).await {
        return Err(unknown_kernel(&id));
    }
    j.sessions_of_kernel_gone(&key);
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/kernels/{id}/interrupt`: KeyboardInterrupt in the running
/// cell, state kept. 204.
pub(crate) async fn interrupt(
    State(j): State<Jupyter>,
    scope: Scope,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Path(id) = id.map_err(path_error)?;
    let key = scope.key(&id);
    if j.model(&scope, &key).is_none() {
        return Err(unknown_kernel(&id));
    }
    j.app.manager.interrupt(&key).await;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/kernels/{id}/restart`: the state is discarded; the next
/// cell runs in a fresh process. 200 with the model.
pub(crate) async fn restart(
    State(j): State<Jupyter>,
    scope: Scope,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = id.map_err(path_error)?;
    let key = scope.key(&id);
    if !j.dispose(&key, false).await {
        return Err(unknown_kernel(&id));
    }
    let hub = j.hub_or_new(&key, SPEC_NAME);
    let s = &hub.shared;
    s.send_all(&[
        (None, &messages::status("restarting", &s.session, None)),
        (None, &messages::status("idle", &s.session, None)),
    ]);
    Ok(Json(
        j.model(&scope, &key).unwrap_or_else(|| json!({ "id": id })),
    ))
}

// ---- sessions ------------------------------------------------------------

/// The body of `POST /api/sessions` (and `PATCH`).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct SessionBody {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    kernel: Option<KernelRef>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct KernelRef {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

/// A session as stored: its fields and its kernel's id.
#[derive(Debug, Clone)]
pub(crate) struct JSession {
    path: String,
    name: String,
    kind: String,
    /// The kernel's owner key.
    kernel: String,
    /// Who made it: only that caller (and the admin) sees it.
    caller: crate::tenant::Caller,
}

impl Jupyter {
    fn session_model(&self, scope: &Scope, id: &str, s: &JSession) -> Value {
        json!({
            "id": id,
            "path": s.path,
            "name": s.name,
            "type": s.kind,
            "kernel": self
                .model(scope, &s.kernel)
                .unwrap_or_else(|| json!({"id": scope.name_of(&s.kernel)})),
            "notebook": {"path": s.path, "name": s.name},
        })
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, JSession>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Session `id` if the caller may see it.
    fn session_of(&self, scope: &Scope, id: &str) -> Option<JSession> {
        self.sessions()
            .get(id)
            .filter(|s| scope.0.tenant().is_none() || s.caller == scope.0)
            .cloned()
    }

    /// Sessions whose kernel was deleted go with it.
    fn sessions_of_kernel_gone(&self, kernel: &str) {
        self.sessions().retain(|_, s| s.kernel != kernel);
    }
}

fn unknown_jsession(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_session",
        format!("no Jupyter session {id:?}; list them with GET /api/sessions"),
    )
}

/// `GET /api/sessions`.
pub(crate) async fn list_sessions(State(j): State<Jupyter>, scope: Scope) -> Json<Value> {
    let all: Vec<(String, JSession)> = j
        .sessions()
        .iter()
        .filter(|(_, s)| scope.0.tenant().is_none() || s.caller == scope.0)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Json(Value::Array(
        all.iter()
            .map(|(id, s)| j.session_model(&scope, id, s))
            .collect(),
    ))
}

/// `POST /api/sessions`: a session for `path`, on the named kernel (or
/// a new one). The same path again gets the existing session.
pub(crate) async fn create_session(
    State(j): State<Jupyter>,
    scope: Scope,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match parse_body::<SessionBody>(
        body,
        r#"{"path": "a.ipynb", "type": "notebook", "kernel": {"name": "python3"}}"#,
    ) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let path = body.path.clone().unwrap_or_default();
    let existing = j
        .sessions()
        .iter()
        .find(|(_, s)| !path.is_empty() && s.path == path && s.caller == scope.0)
        .map(|(k, v)| (k.clone(), v.clone()));
    if let Some((id, s)) = existing {
        return created(j.session_model(&scope, &id, &s), "sessions");
    }
    let kernel = body.kernel.unwrap_or_default();
    let model = match j.start(&scope, kernel.id, kernel.name.as_deref()) {
        Ok(m) => m,
        Err(e) => return e.into_response(),
    };
    let s = JSession {
        name: body.name.unwrap_or_else(|| path.clone()),
        path,
        kind: body.kind.unwrap_or_else(|| "notebook".to_owned()),
        kernel: scope.key(model["id"].as_str().unwrap_or_default()),
        caller: scope.0.clone(),
    };
    let id = super::new_uuid();
    j.sessions().insert(id.clone(), s.clone());
    created(j.session_model(&scope, &id, &s), "sessions")
}

/// `GET /api/sessions/{id}`.
pub(crate) async fn get_session(
    State(j): State<Jupyter>,
    scope: Scope,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = id.map_err(path_error)?;
    let s = j.session_of(&scope, &id);
    s.map(|s| Json(j.session_model(&scope, &id, &s)))
        .ok_or_else(|| unknown_jsession(&id))
}

/// `PATCH /api/sessions/{id}`: rename, move, or switch kernel.
pub(crate) async fn patch_session(
    State(j): State<Jupyter>,
    scope: Scope,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(id) = id.map_err(path_error)?;
    let body = parse_body::<SessionBody>(body, r#"{"path": "b.ipynb"}"#)?;
    let Some(mut s) = j.session_of(&scope, &id) else {
        return Err(unknown_jsession(&id));
    };
    if let Some(k) = body.kernel {
        let model = j.start(&scope, k.id, k.name.as_deref())?;
        s.kernel = scope.key(model["id"].as_str().unwrap_or_default());
    }
    if let Some(p) = body.path {
        s.path = p;
    }
    if let Some(n) = body.name {
        s.name = n;
    }
    if let Some(t) = body.kind {
        s.kind = t;
    }
    j.sessions().insert(id.clone(), s.clone());
    Ok(Json(j.session_model(&scope, &id, &s)))
}

/// `DELETE /api/sessions/{id}`: the session and its kernel go. 204.
pub(crate) async fn delete_session(
    State(j): State<Jupyter>,
    scope: Scope,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Path(id) = id.map_err(path_error)?;
    if j.session_of(&scope, &id).is_none() {
        return Err(unknown_jsession(&id));
    }
    let Some(s) = j.sessions().remove(&id) else {
        return Err(unknown_jsession(&id));
    };
    j.dispose(&s.kernel, true).await;
    j.sessions_of_kernel_gone(&s.kernel);
    Ok(StatusCode::NO_CONTENT)
}
