//! The dashboard at `/`: one page, its script and style embedded in the
//! binary (no CDN: it works offline). It polls `/v1/kernels` and
//! `/v1/history` once a second.

use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::ApiError;

const INDEX: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const STYLE: &str = include_str!("../assets/style.css");

pub(crate) async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        INDEX,
    )
        .into_response()
}

pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    let (mime, body) = match file.as_str() {
        "app.js" => ("text/javascript; charset=utf-8", APP_JS),
        "style.css" => ("text/css; charset=utf-8", STYLE),
        _ => {
            return ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                "not_found",
                format!("no dashboard asset {file:?}"),
            )
            .into_response()
        }
    };
    ([(header::CONTENT_TYPE, mime)], body).into_response()
}
