//! `hooks.json`: the model, its validation, and the workspace watcher that hot-reloads it.
//!
//! Flow: the watcher notices a change → [`load`] parses and validates the file into a
//! [`HookTable`] (errors as `FILE:LINE:COL: JSON.PATH: reason`) → the new table is swapped in
//! with `ArcSwap`. An invalid file is reported and the last good table stays active.

pub mod edit;
pub(crate) mod env_policy;
mod error;
mod load;
pub mod model;
pub(crate) mod spanned;
mod watch;

pub use edit::{ETag, EditError, Hook, HooksEditor, Listing, Removed, Written, parse_body};
pub use error::{ConfigError, ConfigErrors};
pub(crate) use error::{Lines, Path as JsonPath, one_line, quote};
pub use load::{
    BLOCKED_ENV, HOOKS_FILE, MAX_ACTIONS, MAX_ARGS, MAX_ENV, MAX_ERRORS, MAX_FILE_BYTES,
    MAX_MAX_CONCURRENT, MAX_TIMEOUT_MS, MIN_TIMEOUT_MS, SANITIZED_PATH, SHELL_METACHARACTERS,
    empty_table, file_label, is_blocked_env, is_valid_id, is_zero_hook_var, load,
    load_with_warnings, normalize_event_key, parse, parse_with_warnings, read_hooks_file,
    resolve_bare, resolve_bare_in,
};
pub(crate) use load::{finish as finish_errors, normalize, raw as raw_error};
pub(crate) use model::glob_match;
pub use model::{
    Action, DEFAULT_MAX_CONCURRENT, DEFAULT_TIMEOUT_MS, HookLimits, HookTable, Matcher,
};
pub(crate) use watch::{CONFIG_SECTION, Doc, Watch, label_of};
pub use watch::{ConfigStats, ConfigWatcher, Reload, WatchOptions, WatcherKind};
