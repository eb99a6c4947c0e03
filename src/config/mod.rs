//! `hooks.json`: the model, its validation, and the workspace watcher that hot-reloads it.
//!
//! Flow: the watcher notices a change → `load` parses and validates the file into a
//! [`HookTable`] (errors as `FILE:LINE:COL: JSON.PATH: reason`) → the new table is swapped in
//! with `ArcSwap`. An invalid file is reported and the last good table stays active.

pub mod model;

pub use model::{Action, HookTable, Matcher};
