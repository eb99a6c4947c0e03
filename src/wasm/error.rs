//! [`PluginError`]: one problem loading a plugin, with the file, line, column and key it is at.

use crate::config::ConfigError;
use std::fmt;

/// One problem loading a plugin: in its `plugin.toml` (with the line, column and key path, like
/// [`ConfigError`]), in its component (the `.wasm` file as a whole: no line), or in the plugin
/// host itself (no file).
///
/// `Display` is the one line `prx-hooks validate` prints: `FILE:LINE:COL: PATH: reason` for a
/// place in a manifest, `FILE: reason` for a file as a whole, `reason` alone otherwise.
///
/// # Examples
///
/// ```
/// use prx_hooks::wasm::PluginError;
/// let e = PluginError::in_file("plugins/a/plugin.wasm", "not a regular file");
/// assert_eq!((e.line, e.col), (0, 0));
/// assert_eq!(e.to_string(), "plugins/a/plugin.wasm: not a regular file");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PluginError {
    /// The file: `plugins/audit/plugin.toml`, `plugins/audit/plugin.wasm`; `""` for a problem
    /// of the plugin host itself.
    pub file: String,
    /// 1-based line in `file`; 0 when the problem is about the file as a whole.
    pub line: usize,
    /// 1-based column in characters; 0 when `line` is.
    pub col: usize,
    /// The key path in plugin.toml (`resources.max_fuel`); `""` when the problem is not
    /// about a key.
    pub path: String,
    /// What is wrong and, where it helps, what to write instead.
    pub reason: String,
}

impl PluginError {
    /// A problem with `file` as a whole (a component that cannot be read, compiled, linked or
    /// started).
    pub fn in_file(file: impl fmt::Display, reason: impl Into<String>) -> PluginError {
        PluginError {
            file: file.to_string(),
            line: 0,
            col: 0,
            path: String::new(),
            reason: reason.into(),
        }
    }

    /// A problem of the plugin host (the engine or the host's linker), about no file.
    pub fn host(reason: impl Into<String>) -> PluginError {
        PluginError::in_file("", reason)
    }
}

impl From<ConfigError> for PluginError {
    fn from(e: ConfigError) -> PluginError {
        PluginError {
            file: e.file,
            line: e.line,
            col: e.col,
            path: e.path,
            reason: e.reason,
        }
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.file.is_empty()) {
            (0, true) => f.write_str(&self.reason),
            (0, false) => write!(f, "{}: {}", self.file, self.reason),
            _ => write!(
                f,
                "{}:{}:{}: {}: {}",
                self.file, self.line, self.col, self.path, self.reason
            ),
        }
    }
}

impl std::error::Error for PluginError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_error_keeps_its_file_line_column_and_key() {
        let e = PluginError::from(ConfigError {
            file: "plugins/a/plugin.toml".into(),
            line: 7,
            col: 13,
            path: "resources.max_fuel".into(),
            reason: "must be at least 1".into(),
        });
        assert_eq!(e.file, "plugins/a/plugin.toml");
        assert_eq!((e.line, e.col), (7, 13));
        assert_eq!(e.path, "resources.max_fuel");
        assert_eq!(
            e.to_string(),
            "plugins/a/plugin.toml:7:13: resources.max_fuel: must be at least 1"
        );
    }

    #[test]
    fn a_host_error_is_its_reason_alone() {
        let e = PluginError::host("cannot link the host: x");
        assert_eq!(e.to_string(), "cannot link the host: x");
        assert!(e.file.is_empty() && e.path.is_empty());
    }
}
