//! `GET /openapi.json`: the OpenAPI 3 document, generated from the
//! handlers' annotations so it cannot drift from them.

use axum::Json;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "cellhost", description = "Session-persistent Python kernels for AI agents: the daemon's HTTP API."),
    paths(
        crate::api::execute,
        crate::api::interrupt,
        crate::api::snapshot_session,
        crate::api::fork_session,
        crate::api::fork_child,
        crate::api::dispose_session,
        crate::api::dispose_child,
        crate::api::session_history,
        crate::api::recent_history,
        crate::events::session,
        crate::events::child,
        crate::api::kernels,
        crate::api::environment,
        crate::api::healthz,
    ),
    components(schemas(
        crate::ExecuteRequest,
        crate::error::ErrorBody,
        crate::error::ErrorDetail,
        cellhost_protocol::CellResult,
        cellhost_protocol::SnapshotReport,
        cellhost_protocol::ForkRequest,
        cellhost_protocol::ForkTarget,
        cellhost_protocol::ForkTargets,
        cellhost_protocol::ForkReport,
        cellhost_protocol::Forked,
        cellhost_protocol::ForkPath,
        cellhost_protocol::Skipped,
        cellhost_protocol::Restored,
        cellhost_protocol::RestoreFrom,
        cellhost_protocol::KernelSummary,
        cellhost_protocol::Environment,
    )),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub(crate) struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

pub(crate) async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
