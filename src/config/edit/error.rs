//! Why an edit was refused ([`EditError`]), and the loader's errors made relative to the hook
//! being written.

use super::*;

/// Why an edit was refused. Nothing was written.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// The request body has the wrong shape (not a JSON object, …): 400.
    #[error("{0}")]
    BadRequest(String),
    /// The request body is not JSON (syntax, UTF-8): 400. `path` is where the reader was
    /// (`args[1]`; `$` is the body itself), `""` when unknown.
    #[error("{error}")]
    Malformed {
        /// The reader's message.
        error: String,
        /// Where in the body the reader was.
        path: String,
    },
    /// No hook has this id: 404.
    #[error("no hook has the id {}", quote(.id))]
    NotFound {
        /// The id asked for.
        id: String,
    },
    /// hooks.json changed on disk since the editor last read it and the caller's view was
    /// based on the old file: 409. The file is left as it is.
    #[error("{0}")]
    Conflict(String),
    /// `If-Match` names a version that is not the current one: 412.
    #[error("{0}")]
    PreconditionFailed(String),
    /// The document the edit would produce does not validate: 422. `error` is the loader's
    /// line (or the editor's own reason), `path` is relative to the request body (`args[2]`)
    /// when the error is in the hook being written, else the document path.
    #[error("{error}")]
    Invalid {
        /// The loader's line, or the editor's own reason.
        error: String,
        /// Where the error is (see above).
        path: String,
    },
    /// The file on disk does not validate (a hand edit broke it): 409, fix the file first.
    #[error("{error}")]
    FileInvalid {
        /// The loader's line about the file.
        error: String,
        /// The document path of the error.
        path: String,
    },
    /// The file could not be read or written: 500.
    #[error("{0}")]
    Io(String),
}

impl EditError {
    /// The HTTP status this error maps to.
    pub fn status(&self) -> u16 {
        match self {
            EditError::BadRequest(_) | EditError::Malformed { .. } => 400,
            EditError::NotFound { .. } => 404,
            EditError::Conflict(_) | EditError::FileInvalid { .. } => 409,
            EditError::PreconditionFailed(_) => 412,
            EditError::Invalid { .. } => 422,
            EditError::Io(_) => 500,
        }
    }

    /// A stable machine-readable name.
    pub fn kind(&self) -> &'static str {
        match self {
            EditError::BadRequest(_) => "bad_request",
            EditError::Malformed { .. } => "bad_json",
            EditError::NotFound { .. } => "not_found",
            EditError::Conflict(_) => "conflict",
            EditError::PreconditionFailed(_) => "precondition_failed",
            EditError::Invalid { .. } => "invalid",
            EditError::FileInvalid { .. } => "file_invalid",
            EditError::Io(_) => "io",
        }
    }

    /// The JSON path the error points at, relative to the body (`args[2]`; `$` is the body
    /// as a whole), or in the file for [`EditError::FileInvalid`]; `""` when the error is not
    /// about a place.
    pub fn path(&self) -> &str {
        match self {
            EditError::Invalid { path, .. }
            | EditError::FileInvalid { path, .. }
            | EditError::Malformed { path, .. } => path,
            _ => "",
        }
    }
}

/// Where the hook being written sits in the new document.
pub(super) struct Loc {
    pub(super) key: String,
    pub(super) index: usize,
    /// Whether the event key was added for it (an error on the key is about `event`).
    pub(super) new_key: bool,
}

impl Loc {
    pub(super) fn none() -> Loc {
        Loc {
            key: String::new(),
            index: usize::MAX,
            new_key: false,
        }
    }
}

/// The loader's first error about the hook being written (`PATH: reason`, the path made
/// relative to the body, without a position in a document that was never written), else its
/// first error as the loader words it (`hooks.json:LINE:COL: PATH: reason`).
pub(super) fn map_errors(errs: &ConfigErrors, loc: &Loc) -> EditError {
    let key_path = JPath::root().key("hooks").key(&loc.key).to_string();
    if loc.index != usize::MAX {
        let prefix = JPath::root()
            .key("hooks")
            .key(&loc.key)
            .index(loc.index)
            .to_string();
        for e in errs {
            let rel = match relative_path(&e.path, &prefix) {
                Some(rel) => Some(rel),
                None if loc.new_key && e.path == key_path => Some("event".to_string()),
                None => None,
            };
            if let Some(path) = rel {
                return EditError::Invalid {
                    error: format!("{path}: {}", e.reason),
                    path,
                };
            }
        }
    }
    match errs.iter().next() {
        Some(e) => EditError::Invalid {
            error: e.to_string(),
            path: e.path.clone(),
        },
        None => EditError::Invalid {
            error: "invalid".into(),
            path: "$".into(),
        },
    }
}

/// `path` relative to the hook at `prefix` (`hooks.tool_call[3]`): `args[2]`, `$` for the
/// hook itself; `None` when it is elsewhere.
pub(super) fn relative_path(path: &str, prefix: &str) -> Option<String> {
    let rest = path.strip_prefix(prefix)?;
    if rest.is_empty() {
        Some("$".to_string())
    } else if let Some(r) = rest.strip_prefix('.') {
        Some(r.to_string())
    } else if rest.starts_with('[') {
        Some(rest.to_string())
    } else {
        None
    }
}

/// A loader warning (`LABEL:LINE:COL: PATH: reason`) about the hook at `prefix`, as
/// `PATH: reason` with the path relative to the hook; `None` for warnings about other hooks.
pub(super) fn relative_warning(warning: &str, label: &str, prefix: &str) -> Option<String> {
    let rest = warning.strip_prefix(label)?.strip_prefix(':')?;
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    let rest = rest.strip_prefix(':')?;
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    let rest = rest.strip_prefix(": ")?;
    let after = rest.strip_prefix(prefix)?;
    let (tail, reason) = after.split_once(": ")?;
    let rel = relative_path(&format!("{prefix}{tail}"), prefix)?;
    Some(format!("{rel}: {reason}"))
}
