//! The API's one error shape: `{"error": "...", "path": "...", "kind": "..."}` with a status.

use crate::config::EditError;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// An error response. `path` is relative to the request body (`args[2]`), `""` when the error
/// is not about a place in it.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub error: String,
    pub path: String,
    /// `Retry-After` seconds (429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        kind: &'static str,
        error: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            kind,
            error: error.into(),
            path: String::new(),
            retry_after: None,
        }
    }

    pub(crate) fn at(mut self, path: impl Into<String>) -> ApiError {
        self.path = path.into();
        self
    }

    pub(crate) fn bad_request(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", error)
    }

    pub(crate) fn invalid(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", error)
    }

    pub(crate) fn unavailable(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", error)
    }

    pub(crate) fn internal(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", error)
    }

    /// 429 with `Retry-After`.
    pub(crate) fn too_many(error: impl Into<String>, retry_after_secs: u64) -> ApiError {
        let mut e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_requests", error);
        e.retry_after = Some(retry_after_secs.max(1));
        e
    }
}

impl From<EditError> for ApiError {
    fn from(e: EditError) -> ApiError {
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let path = e.path().to_string();
        ApiError::new(status, e.kind(), e.to_string()).at(path)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": self.error,
            "path": self.path,
            "kind": self.kind,
        });
        let mut resp = super::json_response(self.status, &body);
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(r#"Bearer realm="prx-hooks""#),
            );
        }
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// 404 for a path no route has; `hint` names the routes (`routes.rs` builds it from the
/// route table).
pub(crate) fn not_found(path: &str, hint: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route {}; {hint}", crate::config::quote(path)),
    )
}
