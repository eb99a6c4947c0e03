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
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, error: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            error: error.into(),
            path: String::new(),
        }
    }

    pub fn at(mut self, path: impl Into<String>) -> ApiError {
        self.path = path.into();
        self
    }

    pub fn bad_request(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", error)
    }

    pub fn invalid(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", error)
    }

    pub fn unavailable(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", error)
    }

    pub fn internal(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", error)
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
        resp
    }
}

/// Unknown paths.
pub(crate) async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no route {}; the API is under /api/hooks, /api/plugins, /api/stats, /metrics and /healthz",
            crate::config::quote(uri.path())
        ),
    )
}

/// A known path with a method it does not have.
pub(crate) async fn method_not_allowed(
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{method} is not allowed on {}",
            crate::config::quote(uri.path())
        ),
    )
}
