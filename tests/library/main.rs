//! The library's own tests: the pipeline and its races, hooks.json (loading, editing, reload),
//! the shell backend (scheduling, run feed, environment, containment) and plugin manifests.
//!
//! One test binary per area (each links the whole library): the modules are the former
//! per-file binaries, the shared helpers are declared once here.

#[path = "../support/fixtures.rs"]
mod fixtures;
#[path = "../support/procs.rs"]
mod procs;

mod agent_rules;
mod agents;
mod command_policies;
mod config;
mod config_edit;
mod core_races;
mod env_policy;
mod pipeline;
mod policies;
mod reload;
mod run_feed;
mod scheduling;
mod sessions;
mod shell;
mod wasm_manifest;
