//! HTTP surface: `/metrics` (text 0.0.4 or OpenMetrics by `Accept`), `/health`, and `/`.
//!
//! Unlike dcgm-exporter (reference §1.1) a scrape never answers 500 for one bad device: it
//! renders whatever the last poll produced.

use std::sync::Arc;

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, HeaderValue, header},
    response::{IntoResponse, Response},
    routing::get,
};

use crate::{exposition::Format, state::Shared};

/// The router over `shared`; serve it with [`kiln_httpd::serve`] (as [`crate::serve`] does) or
/// call it with tower's `oneshot`.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/", get(index))
        .with_state(shared)
}

async fn metrics(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::negotiate(accept);
    let body = shared.render(format);
    let mut resp = body.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    resp.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// `200 OK` once the first poll has run (it runs before the listener opens).
async fn health(State(shared): State<Arc<Shared>>) -> Response {
    if shared.snapshot().generation > 0 {
        "OK".into_response()
    } else {
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "no GPU sample yet",
        )
            .into_response()
    }
}

async fn index() -> impl IntoResponse {
    "kiln exporter: /metrics, /health\n"
}
