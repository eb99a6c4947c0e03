//! `prx-hooks fire`: one event through the workspace's hooks and plugins.
//!
//! Its exit codes are ones an agent's hook runner will not read as a decision (docs/cli.md
//! § Exit codes).

use crate::contain::{contain, shell_limits};
use crate::{ContainArgs, EventLimitArgs};
use clap::Args;
#[cfg(feature = "wasm")]
use prx_hooks::Sink;
use prx_hooks::{EventKind, ndjson};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub(crate) struct FireArgs {
    /// The event: agent_start, agent_end, llm_request, llm_response, tool_call_start,
    /// tool_call, turn_complete or error.
    event: String,
    /// The payload JSON (checked like an NDJSON payload), `@FILE` to read it from a file or
    /// `-` from stdin; without it a sample payload is used.
    #[arg(long, value_name = "JSON|@FILE|-")]
    payload: Option<String>,
    #[command(flatten)]
    limits: EventLimitArgs,
    /// The workspace directory (hooks.json, plugins/).
    #[arg(long, default_value = ".")]
    workspace: PathBuf,
    /// One JSON object per outcome instead of text.
    #[arg(long)]
    json: bool,
    /// Run every enabled hook of the event whatever its matcher (by default a hook whose
    /// matcher does not match the payload's tool is skipped, as in `run`).
    #[arg(long)]
    ignore_matcher: bool,
    #[command(flatten)]
    contain: ContainArgs,
}

/// `fire`'s plugin side: loads the workspace's plugins once; each plugin that fails to load
/// is reported on stderr and the others run (the caller exits 1 when any failed).
#[cfg(feature = "wasm")]
fn fire_load_plugins(
    workspace: &std::path::Path,
) -> Result<(prx_hooks::wasm::WasmSink, bool), crate::BoxError> {
    let sink = prx_hooks::wasm::WasmSink::standalone(workspace.to_path_buf())?;
    let errors = sink.errors();
    for error in &errors {
        say!("{error}");
    }
    Ok((sink, !errors.is_empty()))
}

/// `fire`'s own errors, each with the exit code it ends with. `fire` is offered as a command
/// for agents' hooks, and Claude Code, Codex and Gemini CLI read exit 2 as "block" (Cursor as
/// "deny"), so none of these is 2 (docs/cli.md § Exit codes).
struct FireError {
    code: u8,
    message: String,
}

/// sysexits.h: a bad flag, argument, event name or workspace.
pub(super) const EX_USAGE: u8 = 64;
/// A payload that cannot be read, is not the event's, or is over `--max-event-bytes`.
const EX_DATAERR: u8 = 65;
/// Something that should not fail did (a thread, the plugin engine, stdout).
const EX_SOFTWARE: u8 = 70;
/// The operating system refused what was asked (`--harden`).
const EX_OSERR: u8 = 71;
/// hooks.json does not load.
const EX_CONFIG: u8 = 78;

impl FireError {
    fn new(code: u8, message: impl std::fmt::Display) -> FireError {
        FireError {
            code,
            message: message.to_string(),
        }
    }
}

/// Whether the command line runs `fire` (the first word that is not a flag): its usage errors
/// exit [`EX_USAGE`], not clap's 2.
pub(super) fn fire_invoked() -> bool {
    std::env::args_os()
        .skip(1)
        .find(|a| !a.as_encoded_bytes().starts_with(b"-"))
        .is_some_and(|a| a == "fire")
}

/// `fire` as a command: its errors on stderr, with their codes.
pub(super) fn fire_command(args: FireArgs) -> ExitCode {
    match fire(args) {
        Ok(code) => code,
        Err(e) => {
            if !e.message.is_empty() {
                say!("prx-hooks: {}", e.message);
            }
            ExitCode::from(e.code)
        }
    }
}

/// `fire`: exit 0 if every hook succeeded (or was skipped), 1 on any failure, and its own
/// errors as [`FireError`]s (64 usage, 65 payload, 78 hooks.json; never 2).
fn fire(args: FireArgs) -> Result<ExitCode, FireError> {
    let (kind, name) = event_kind(&args.event)?;
    let record = read_record(&args, kind)?;
    let table = load_table(&args.workspace)?;
    #[cfg(feature = "wasm")]
    let (plugins, plugins_failed) =
        fire_load_plugins(&args.workspace).map_err(|e| FireError::new(EX_SOFTWARE, e))?;
    let limits = shell_limits(&args.contain).map_err(|e| FireError::new(EX_USAGE, e))?;
    let containment = contain(&args.contain).map_err(|e| FireError::new(EX_OSERR, e))?;
    let shell = prx_hooks::shell::ShellSink::standalone(args.workspace.clone(), limits);
    shell.set_table(Arc::new(table));
    let msg = prx_hooks::shell::message_from_json(
        kind,
        &record.payload_json(),
        &record.agent,
        &record.session,
        0,
    );
    let opts = prx_hooks::shell::RunOptions::default().ignore_matcher(args.ignore_matcher);
    let outcomes = shell.run_matching_with(&msg, &opts);
    shell.shutdown(Instant::now() + Duration::from_secs(2));
    containment.finish();
    #[allow(unused_mut)]
    let mut failed = outcomes.iter().any(|o| o.kind.is_failure());
    for outcome in &outcomes {
        print_outcome(args.json, outcome)?;
    }
    #[allow(unused_mut)]
    let mut ran = outcomes.len();
    #[cfg(feature = "wasm")]
    {
        let fired = plugins.fire(kind, &msg);
        // Writes the plugins' kv stores, so the next `fire` sees them.
        plugins.shutdown(Instant::now() + Duration::from_secs(2));
        for outcome in &fired {
            print_outcome(args.json, outcome)?;
        }
        failed |= plugins_failed || fired.iter().any(|o| !o.is_ok());
        ran += fired.len();
    }
    if ran == 0 {
        say!("no hooks or plugins for {name}");
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The event named on the command line (any spelling `normalize_event_key` takes), and its
/// name as the hooks know it.
fn event_kind(event: &str) -> Result<(EventKind, String), FireError> {
    let name = prx_hooks::config::normalize_event_key(event);
    let Some(kind) = EventKind::from_name(&name) else {
        let names: Vec<_> = EventKind::ALL.iter().map(|k| k.name()).collect();
        return Err(FireError::new(
            EX_USAGE,
            format!(
                "unknown event {:?}; expected one of {}",
                event,
                names.join(", ")
            ),
        ));
    };
    Ok((kind, name))
}

/// The event's payload (`--payload`, `@FILE`, stdin, or the sample), checked like an NDJSON
/// payload and against `--max-event-bytes`.
fn read_record(args: &FireArgs, kind: EventKind) -> Result<ndjson::Record, FireError> {
    let (payload, source) = match args.payload.as_deref() {
        None => (kind.sample_payload().to_string(), "--payload".to_string()),
        Some("-") => {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).map_err(|e| {
                FireError::new(EX_DATAERR, format!("--payload -: reading stdin: {e}"))
            })?;
            (text, "-".to_string())
        }
        Some(arg) => match arg.strip_prefix('@') {
            Some(file) => (
                std::fs::read_to_string(file)
                    .map_err(|e| FireError::new(EX_DATAERR, format!("--payload @{file}: {e}")))?,
                file.to_string(),
            ),
            None => (arg.to_string(), "--payload".to_string()),
        },
    };
    // A file's or stdin's trailing newline is not part of the JSON's meaning.
    let payload = payload.trim_end();
    let record = ndjson::parse_payload(kind, payload, "prx-hooks", "fire")
        .map_err(|e| FireError::new(EX_DATAERR, located(&source, payload, &e)))?;
    if record.byte_len() > args.limits.max_event_bytes {
        return Err(FireError::new(
            EX_DATAERR,
            format!(
                "{source}: event of {} bytes exceeds max_event_bytes ({}); raise it with --max-event-bytes",
                record.byte_len(),
                args.limits.max_event_bytes
            ),
        ));
    }
    Ok(record)
}

/// The workspace's hooks.json; its errors on stderr (exit 78), its warnings logged.
fn load_table(workspace: &Path) -> Result<prx_hooks::config::HookTable, FireError> {
    if !workspace.is_dir() {
        return Err(FireError::new(
            EX_USAGE,
            format!("workspace {} is not a directory", workspace.display()),
        ));
    }
    let table = match prx_hooks::config::load(workspace) {
        Ok(table) => table,
        Err(errors) => {
            for error in errors.iter() {
                say!("{error}");
            }
            return Err(FireError::new(EX_CONFIG, ""));
        }
    };
    for warning in &table.warnings {
        tracing::warn!("{warning}");
    }
    Ok(table)
}

/// One outcome on stdout, as text or (`--json`) one JSON object. One that cannot be printed
/// is an internal error (70), not a panic.
fn print_outcome(
    json: bool,
    outcome: &(impl serde::Serialize + std::fmt::Display),
) -> Result<(), FireError> {
    use std::io::Write as _;
    let line = if json {
        serde_json::to_string(outcome).map_err(|e| FireError::new(EX_SOFTWARE, e))?
    } else {
        outcome.to_string()
    };
    writeln!(std::io::stdout(), "{line}")
        .map_err(|e| FireError::new(EX_SOFTWARE, format!("writing to stdout: {e}")))
}

/// `SOURCE:LINE:COL: path: reason` for an error in a payload that may span lines (a
/// pretty-printed `@FILE`): the error's byte column becomes a line and a column.
fn located(source: &str, text: &str, e: &ndjson::LineError) -> String {
    let offset = e.column().saturating_sub(1).min(text.len());
    let before = &text.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let col = offset
        - before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1)
        + 1;
    let path = match e.path() {
        "" => String::new(),
        p => format!("{p}: "),
    };
    format!("{source}:{line}:{col}: {path}{}", e.reason())
}
