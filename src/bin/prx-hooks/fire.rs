//! `prx-hooks fire`: one event through the workspace's hooks and plugins, with exit codes an
//! agent's hook runner will not read as a decision.

use super::*;

/// `fire`'s plugin side: loads the workspace's plugins once; each plugin that fails to load
/// is reported on stderr and the others run (the caller exits 1 when any failed).
#[cfg(feature = "wasm")]
fn fire_load_plugins(
    workspace: &std::path::Path,
) -> Result<(prx_hooks::wasm::WasmSink, bool), BoxError> {
    let sink = prx_hooks::wasm::WasmSink::standalone(workspace.to_path_buf())?;
    let errors = sink.errors();
    for error in &errors {
        eprintln!("{error}");
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
                eprintln!("prx-hooks: {}", e.message);
            }
            ExitCode::from(e.code)
        }
    }
}

/// `fire`: exit 0 if every hook succeeded (or was skipped), 1 on any failure, and its own
/// errors as [`FireError`]s (64 usage, 65 payload, 78 hooks.json; never 2).
fn fire(args: FireArgs) -> Result<ExitCode, FireError> {
    let name = prx_hooks::config::normalize_event_key(&args.event);
    let Some(kind) = EventKind::from_name(&name) else {
        let names: Vec<_> = EventKind::ALL.iter().map(|k| k.name()).collect();
        return Err(FireError::new(
            EX_USAGE,
            format!(
                "unknown event {:?}; expected one of {}",
                args.event,
                names.join(", ")
            ),
        ));
    };
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
    if !args.workspace.is_dir() {
        return Err(FireError::new(
            EX_USAGE,
            format!("workspace {} is not a directory", args.workspace.display()),
        ));
    }
    let table = match prx_hooks::config::load(&args.workspace) {
        Ok(table) => table,
        Err(errors) => {
            for error in errors.iter() {
                eprintln!("{error}");
            }
            return Err(FireError::new(EX_CONFIG, ""));
        }
    };
    for warning in &table.warnings {
        tracing::warn!("{warning}");
    }
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
    // An outcome that cannot be printed is an internal error (70), not a panic.
    let print = |line: String| {
        use std::io::Write as _;
        writeln!(std::io::stdout(), "{line}")
            .map_err(|e| FireError::new(EX_SOFTWARE, format!("writing to stdout: {e}")))
    };
    for outcome in &outcomes {
        if args.json {
            print(serde_json::to_string(outcome).map_err(|e| FireError::new(EX_SOFTWARE, e))?)?;
        } else {
            print(outcome.to_string())?;
        }
    }
    #[allow(unused_mut)]
    let mut ran = outcomes.len();
    #[cfg(feature = "wasm")]
    {
        let fired = plugins.fire(kind, &msg);
        // Writes the plugins' kv stores, so the next `fire` sees them.
        plugins.shutdown(Instant::now() + Duration::from_secs(2));
        for outcome in &fired {
            if args.json {
                print(serde_json::to_string(outcome).map_err(|e| FireError::new(EX_SOFTWARE, e))?)?;
            } else {
                print(outcome.to_string())?;
            }
        }
        failed |= plugins_failed || fired.iter().any(|o| !o.is_ok());
        ran += fired.len();
    }
    if ran == 0 {
        eprintln!("no hooks or plugins for {name}");
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
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
