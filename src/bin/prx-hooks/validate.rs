//! `prx-hooks validate`: hooks.json, policies.json and every plugin manifest checked as `run`
//! loads them.
//!
//! docs/cli.md § `validate`.

use crate::BoxError;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub(crate) struct ValidateArgs {
    /// The workspace directory (hooks.json, policies.json, plugins/).
    #[arg(long, default_value = ".")]
    workspace: PathBuf,
    /// Warnings are errors: exit 1 when there is any.
    #[arg(long)]
    strict: bool,
}

/// `validate`: every error and warning on stdout, one per line; a summary on stderr; exit 1 on
/// any error (and with `--strict` on any warning).
pub(super) fn validate(args: ValidateArgs) -> Result<ExitCode, BoxError> {
    let label = prx_hooks::config::file_label(&args.workspace);
    if !args.workspace.is_dir() {
        return Err(format!("workspace {} is not a directory", args.workspace.display()).into());
    }
    // Errors and warnings in one pass: a file with both shows both.
    let (loaded, warnings) = prx_hooks::config::load_with_warnings(&args.workspace);
    let mut warned = warnings.len();
    let hooks_ok = match &loaded {
        Ok(table) => {
            for warning in &warnings {
                out!("warning: {warning}");
            }
            let enabled = table.actions.iter().filter(|a| a.enabled).count();
            match &table.source {
                Some(_) => say!(
                    "{label}: ok: {} hook(s), {enabled} enabled{}, {} warning(s)",
                    table.actions.len(),
                    if table.enabled {
                        ""
                    } else {
                        " (but the file's \"enabled\" is false)"
                    },
                    warnings.len()
                ),
                None => say!("{label}: not found: no shell hooks"),
            }
            true
        }
        Err(errors) => {
            for error in errors.iter() {
                out!("{error}");
            }
            for warning in &warnings {
                out!("warning: {warning}");
            }
            say!(
                "{label}: {} error(s), {} warning(s)",
                errors.len(),
                warnings.len()
            );
            false
        }
    };
    let (policies_ok, policy_warnings) = validate_policies(&args.workspace);
    warned += policy_warnings;
    let (plugins_ok, plugin_warnings) = validate_plugins(&args.workspace);
    warned += plugin_warnings;
    let ids_ok = validate_policy_ids(&args.workspace);
    if !hooks_ok || !policies_ok || !plugins_ok || !ids_ok {
        return Ok(ExitCode::from(1));
    }
    if args.strict && warned > 0 {
        say!("--strict: {warned} warning(s), counted as errors");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Checks every plugin (manifest, compile, `on-event` and its type, linking, a probe
/// instantiation); prints each problem on stdout (warnings prefixed `warning: `), plugins that
/// are not hooks as notes on stderr, and a summary on stderr. Whether there were no errors,
/// and how many warnings.
pub(super) fn validate_plugins(workspace: &std::path::Path) -> (bool, usize) {
    let scan = prx_hooks::wasm::manifest::scan_all(workspace);
    #[cfg(feature = "wasm")]
    let lines = prx_hooks::wasm::check_workspace(workspace);
    #[cfg(not(feature = "wasm"))]
    let lines: Vec<String> = scan.errors.iter().map(|e| e.to_string()).collect();
    let warnings: Vec<String> = scan
        .warnings
        .iter()
        .chain(scan.manifests.iter().flat_map(|m| &m.warnings))
        .map(|w| w.to_string())
        .collect();
    for line in &lines {
        out!("{line}");
    }
    for w in &warnings {
        out!("warning: {w}");
    }
    for (name, why) in &scan.skipped {
        say!("note: plugin {name}: {why}; skipped (not ours to run)");
    }
    let dir = workspace.join(prx_hooks::wasm::manifest::PLUGINS_DIR);
    if scan.manifests.is_empty() && lines.is_empty() {
        say!("{}: no plugins", dir.display());
    } else if lines.is_empty() {
        let names: Vec<&str> = scan.manifests.iter().map(|m| m.name.as_str()).collect();
        say!(
            "{}: ok: {} plugin(s): {}, {} warning(s)",
            dir.display(),
            names.len(),
            names.join(", "),
            warnings.len()
        );
    } else {
        say!("{}: {} error(s)", dir.display(), lines.len());
    }
    (lines.is_empty(), warnings.len())
}

/// Policy ids are unique across policies.json and the plugins' `[policy] id`: each id written
/// again (in a plugin, after policies.json or an earlier plugin in name order: the one `run`
/// refuses) is an error on stdout naming both places, `FILE:LINE:COL`. Whether there was
/// none. A policies.json or plugin.toml that does not load is left to its own check.
fn validate_policy_ids(workspace: &std::path::Path) -> bool {
    let file = workspace.join(prx_hooks::policy::POLICIES_FILE);
    let label = if workspace == std::path::Path::new(".") {
        prx_hooks::policy::POLICIES_FILE.to_string()
    } else {
        file.display().to_string()
    };
    let mut taken: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    if let Ok(table) = prx_hooks::policy::load(workspace) {
        for (i, (id, (line, col))) in table.ids().enumerate() {
            taken
                .entry(id.to_string())
                .or_insert_with(|| format!("{label}:{line}:{col} (policies[{i}].id)"));
        }
    }
    let mut errors = 0usize;
    for m in prx_hooks::wasm::manifest::scan(workspace).0 {
        let Some(spec) = &m.policy else { continue };
        let (line, col) = spec.id_at;
        let here = format!("{}:{line}:{col}", m.file);
        match taken.get(&spec.id) {
            Some(first) => {
                errors += 1;
                out!(
                    "{here}: policy.id: {} is already the id of {first}: policy ids must be \
                     unique across policies.json and the plugins' [policy] (run refuses this \
                     policy)",
                    serde_json::Value::from(spec.id.as_str())
                );
            }
            None => {
                taken.insert(spec.id.clone(), format!("{here} (plugin {})", m.name));
            }
        }
    }
    if errors > 0 {
        say!("policy ids: {errors} error(s): an id used twice");
    }
    errors == 0
}

/// Checks policies.json as `run` loads it: errors and warnings on stdout (a policy denying
/// everything is a warning), a summary on stderr. Whether there were no errors, and how many
/// warnings.
fn validate_policies(workspace: &std::path::Path) -> (bool, usize) {
    let file = workspace.join(prx_hooks::policy::POLICIES_FILE);
    let label = if workspace == std::path::Path::new(".") {
        prx_hooks::policy::POLICIES_FILE.to_string()
    } else {
        file.display().to_string()
    };
    let (loaded, warnings) = prx_hooks::policy::load_with_warnings(workspace);
    match &loaded {
        Ok(table) => {
            for warning in &warnings {
                out!("warning: {warning}");
            }
            match &table.source {
                Some(_) => say!(
                    "{label}: ok: {} polic(ies), {} enabled{}, {} warning(s)",
                    table.policies.len(),
                    table.policies.iter().filter(|p| p.enabled).count(),
                    if table.enabled {
                        ""
                    } else {
                        " (but the file's \"enabled\" is false)"
                    },
                    warnings.len()
                ),
                None => say!("{label}: not found: no policies"),
            }
            (true, warnings.len())
        }
        Err(errors) => {
            for error in errors.iter() {
                out!("{error}");
            }
            for warning in &warnings {
                out!("warning: {warning}");
            }
            say!(
                "{label}: {} error(s), {} warning(s)",
                errors.len(),
                warnings.len()
            );
            (false, warnings.len())
        }
    }
}
