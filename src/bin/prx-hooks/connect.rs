//! `prx-hooks connect AGENT`: our hook entries written into an agent's own settings.
//!
//! The entries make Claude Code, Codex, Gemini CLI or Cursor feed a workspace's server
//! (docs/connect.md).
//!
//! The user's settings stay byte for byte: JSON is read by `jsonc-parser` and edited at the
//! spans of the members and elements that change ([`json`], connect_json.rs), Codex's TOML
//! through `toml_edit`, which keeps comments and layout. Our entries are found again by what
//! they run ([`agents`]), so `connect` twice writes nothing the second time and `--remove`
//! takes out exactly ours. A changed file is backed up first (`<file>.prx-hooks.bak`), then
//! replaced whole so that a save the agent makes meanwhile is never lost ([`write`]).

#[path = "connect_agents.rs"]
pub(crate) mod agents;
#[path = "connect_json.rs"]
pub(crate) mod json;
#[path = "connect_policies.rs"]
pub(crate) mod policies;
#[path = "connect_write.rs"]
pub(crate) mod write;

use crate::BoxError;
use crate::hook_table::{self, Agent, HookEvent, Written};
use agents::{Hook, Notify, Refusal, Want};
use clap::{Args, ValueEnum};
use prx_hooks::agents::Handlers;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args)]
#[command(after_help = "\
Files (project scope: in --project, default the current directory; user scope: in $HOME):
  claude-code  .claude/settings.json   a command hook per event (async, but where a turn or the
                                       session ends), or with --http an http hook
  codex        ~/.codex/hooks.json     a command hook per event (user scope by default;
                                       $CODEX_HOME is honoured); with --notify, notify in
                                       ~/.codex/config.toml instead
  gemini-cli   .gemini/settings.json   a command hook per event
  cursor       .cursor/hooks.json      a command hook per event
  qwen-code    .qwen/settings.json     a command hook per event
  factory-droid .factory/settings.json a command hook per event
  copilot-cli  .github/hooks/prx-hooks.json  a command hook per event, a file of its own
                                       (user scope: ~/.copilot/hooks/, $COPILOT_HOME honoured)
  windsurf     .windsurf/hooks.json    a command hook per event (user scope:
                                       ~/.codeium/windsurf/hooks.json)

In a project file the command is prx-hooks-send as found on PATH and the workspace is written
relative to the project (\"${CLAUDE_PROJECT_DIR:-.}\"/ws): the file can be committed. --absolute
writes this machine's paths instead (as user scope does).

Exit codes:
  0  connected, removed, or nothing to change (with --dry-run: the diff is on stdout)
  2  nothing written: a usage error, a settings file that is not valid JSON/TOML
     (FILE:LINE:COL: reason), a value of the wrong shape (FILE:LINE:COL: path: reason),
     Codex's notify already running another program (without --force), no TCP address for
     --http, prx-hooks-send not on PATH or a workspace outside the project (without
     --absolute), a file the agent kept saving, or an I/O error")]
pub(crate) struct ConnectArgs {
    /// The agent: claude-code, codex, gemini-cli, cursor, qwen-code, factory-droid,
    /// copilot-cli or windsurf.
    #[arg(value_name = "AGENT")]
    agent: String,
    /// The workspace the agent's events go to (its server's .prx-hooks/address and token, its
    /// spool).
    #[arg(long, default_value = ".")]
    workspace: PathBuf,
    /// project: the settings file in --project; user: the one in $HOME. Default: project
    /// (user for codex).
    #[arg(long, value_enum)]
    scope: Option<Scope>,
    /// The project whose settings to edit (project scope).
    #[arg(long, value_name = "DIR", default_value = ".")]
    project: PathBuf,
    /// Write this machine's absolute paths (the program and the workspace) into a project
    /// file, instead of prx-hooks-send on PATH and a workspace relative to the project.
    #[arg(long)]
    absolute: bool,
    /// Print what would change as a diff (-/+ lines) and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Take our entries out again (only ours; the user's stay).
    #[arg(long)]
    remove: bool,
    /// Claude Code only: an http hook posting to URL/api/ingest/claude-code instead of a
    /// command (URL default: the workspace's running server, when it listens on TCP).
    /// SessionStart and Setup keep a command: Claude Code runs no http hook there.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    http: Option<String>,
    /// Only these events (comma-separated; default every event written by default,
    /// docs/connect.md).
    #[arg(long, value_name = "EVENT,…", value_delimiter = ',')]
    events: Vec<String>,
    /// Codex: its older `notify` program in config.toml instead of its hooks (a fallback for
    /// a Codex without hooks; it sees only the end of each turn).
    #[arg(long)]
    notify: bool,
    /// Codex --notify: replace a notify program that is not ours (it stays in the backup).
    #[arg(long)]
    force: bool,
    /// Claude Code, Codex, Gemini CLI: the events the agent lets a hook decide (a tool about
    /// to run, a prompt, a permission) get entries the agent waits for, which print the
    /// policies' decision (docs/policies.md § Doors). The default when the workspace holds a
    /// policies.json.
    #[arg(long)]
    policies: bool,
    /// With --policies (implied): what those entries answer when no server does: none (the
    /// agent's own flow) or deny.
    #[arg(long, value_name = "MODE", value_enum)]
    on_unreachable: Option<crate::send::OnUnreachable>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scope {
    Project,
    User,
}

/// How often a file the agent keeps saving is read and edited again.
const ATTEMPTS: usize = 3;

/// One line on stderr, prefixed.
fn note(message: impl std::fmt::Display) {
    say!("prx-hooks connect: {message}");
}

/// A refusal: `FILE:LINE:COL: reason` (or `FILE: reason`) on stderr, exit 2.
fn refused(file: &Path, text: &str, r: &Refusal) -> ExitCode {
    match r.at.or_else(|| r.offset.map(|at| json::line_col(text, at))) {
        Some((line, col)) => say!("{}:{line}:{col}: {}", file.display(), r.reason),
        None => say!("{}: {}", file.display(), r.reason),
    }
    say!("prx-hooks connect: {} was not changed", file.display());
    ExitCode::from(2)
}

/// What `connect` was asked, checked.
struct Plan {
    agent: Agent,
    scope: Scope,
    events: Vec<&'static HookEvent>,
    /// The settings file named, and the one written (a link followed).
    file: PathBuf,
    target: PathBuf,
    /// What our entries run (none with `--remove`), and Codex's notify argv.
    hook: Option<Hook>,
    argv: Vec<String>,
    workspace: Option<PathBuf>,
}

/// `connect`: checks the flags, makes the hook entry, edits the settings file at the spans
/// that change, and writes it (backed up first) or, with `--dry-run`, shows the diff.
pub(crate) fn connect(args: ConnectArgs) -> Result<ExitCode, BoxError> {
    let (agent, scope) = agent_and_scope(&args)?;
    let events = pick_events(agent, &args)?;
    let file = settings_path(agent, scope, &args)?;
    // A link is followed: the file it points to is edited, the link stays.
    let target = match std::fs::symlink_metadata(&file) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(&file)
            .map_err(|e| format!("connect: {} is a link to nothing: {e}", file.display()))?,
        _ => file.clone(),
    };
    let (workspace, hook, argv) = if args.remove {
        (None, None, Vec::new())
    } else {
        let (ws, hook, argv) = hook_for(agent, scope, &args)?;
        (Some(ws), Some(hook), argv)
    };
    let plan = Plan {
        agent,
        scope,
        events,
        file,
        target,
        hook,
        argv,
        workspace,
    };
    for _ in 0..ATTEMPTS {
        if let Some(code) = attempt(&plan, &args)? {
            return Ok(code);
        }
        note(format!(
            "{} changed while connect ran (the agent saved it): reading it again",
            plan.file.display()
        ));
    }
    Err(format!(
        "connect: {} kept changing while connect ran ({ATTEMPTS} times): nothing of ours was written; run connect again when the agent is not saving it",
        plan.file.display()
    )
    .into())
}

/// One read, edit and write; `None` when the file changed before it could be written.
fn attempt(plan: &Plan, args: &ConnectArgs) -> Result<Option<ExitCode>, BoxError> {
    let notify = plan.agent == Agent::Codex && args.notify;
    let skeleton = agents::skeleton(plan.agent, notify);
    let current = write::read_settings(&plan.target)?;
    let old = match current.text.as_deref() {
        Some(t) if notify || !t.trim().is_empty() => t,
        _ => skeleton,
    };
    let edited = if notify {
        edit_codex(old, &plan.argv, args, &plan.file)
    } else {
        let want = match &plan.hook {
            Some(hook) => Want::Connect {
                events: &plan.events,
                hook,
            },
            None => Want::Remove,
        };
        agents::apply_json(old, plan.agent, &want)
    };
    let (after, replaced) = match edited {
        Ok(edited) => edited,
        Err(r) => return Ok(Some(refused(&plan.file, old, &r))),
    };
    let change = Change {
        before: current.text.clone(),
        after,
        replaced,
        gone: args.remove && replaced > 0 && current.text.is_some(),
    };
    let gone = change.gone && change.after == skeleton;
    write_change(plan, args, &change, &current, gone)
}

/// The agent, and the scope (default: project, user for Codex); the flags that do not go
/// with them are refused.
fn agent_and_scope(args: &ConnectArgs) -> Result<(Agent, Scope), BoxError> {
    let Some(agent) = Agent::from_name(&args.agent) else {
        return Err(format!(
            "connect: unknown agent {:?}: {}",
            args.agent,
            Agent::names()
        )
        .into());
    };
    let codex = agent == Agent::Codex;
    let scope = args
        .scope
        .unwrap_or(if codex { Scope::User } else { Scope::Project });
    if codex && args.notify && scope == Scope::Project {
        return Err("connect codex --notify: Codex ignores `notify` in a project's .codex/config.toml (it runs machine-local commands only from ~/.codex/config.toml): use --scope user".into());
    }
    if args.http.is_some() && agent != Agent::ClaudeCode {
        return Err(format!(
            "connect {agent}: --http is for Claude Code only (its `http` hook type); {} runs command hooks: leave --http out",
            agent.title()
        )
        .into());
    }
    if codex && args.notify && (args.policies || args.on_unreachable.is_some()) {
        return Err("connect codex --notify: notify cannot decide anything: leave --policies and --on-unreachable out, or --notify (Codex's PreToolUse hook decides)".into());
    }
    if args.http.is_some() && args.remove {
        return Err(
            "connect: --remove takes out our entries whatever they are; leave --http out".into(),
        );
    }
    if args.notify && !codex {
        return Err("connect: --notify is for codex (its older notify program)".into());
    }
    if args.force && !(codex && args.notify) {
        return Err("connect: --force is for codex --notify (its one notify program)".into());
    }
    Ok((agent, scope))
}

/// `--events`, each checked against the agent's events; default those written by default.
fn pick_events(agent: Agent, args: &ConnectArgs) -> Result<Vec<&'static HookEvent>, BoxError> {
    let all = hook_table::hook_events(agent);
    if args.events.is_empty() {
        return Ok(all
            .iter()
            .filter(|e| hook_table::written(e) == Written::Yes)
            .collect());
    }
    if args.notify {
        return Err(
            "connect codex --notify: --events does not apply: notify has no events to pick".into(),
        );
    }
    let mut picked = Vec::new();
    for name in &args.events {
        match hook_table::event(agent, name) {
            Some(e) if hook_table::written(e) == Written::Never => {
                return Err(format!(
                    "connect {agent}: --events: {name} is never written: {}",
                    hook_table::why_not_written(e).unwrap_or_default()
                )
                .into());
            }
            Some(e) => picked.push(e),
            None => {
                let names: Vec<&str> = all.iter().map(|e| e.name).collect();
                return Err(format!(
                    "connect {agent}: --events: unknown event {name:?}; {}'s events: {}",
                    agent.title(),
                    names.join(", ")
                )
                .into());
            }
        }
    }
    Ok(picked)
}

/// `$CODEX_HOME`, or `~/.codex` when it is unset or empty (as Codex reads it).
pub(crate) fn codex_home() -> Result<PathBuf, BoxError> {
    match std::env::var_os("CODEX_HOME").filter(|h| !h.is_empty()) {
        Some(h) => Ok(PathBuf::from(h)),
        None => Ok(home()?.join(".codex")),
    }
}

/// `$HOME`.
pub(crate) fn home() -> Result<PathBuf, BoxError> {
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(h) => Ok(PathBuf::from(h)),
        None => Err("$HOME is not set: the user's settings cannot be found".into()),
    }
}

/// The settings file to edit: in `--project` or in the user's directory.
fn settings_path(agent: Agent, scope: Scope, args: &ConnectArgs) -> Result<PathBuf, BoxError> {
    match scope {
        Scope::Project => {
            Ok(project_dir(&args.project)?.join(agents::settings_file(agent, args.notify)))
        }
        Scope::User => user_settings_file(agent, args.notify),
    }
}

/// The user's settings file of `agent` (Codex's in `$CODEX_HOME`, Copilot CLI's hooks in
/// `$COPILOT_HOME/hooks`, Windsurf's in `~/.codeium/windsurf`).
pub(crate) fn user_settings_file(agent: Agent, notify: bool) -> Result<PathBuf, BoxError> {
    let rel = Path::new(agents::settings_file(agent, notify));
    let name = rel.file_name().unwrap_or_default();
    Ok(match agent {
        Agent::Codex => codex_home()?.join(name),
        Agent::CopilotCli => copilot_home()?.join("hooks").join(name),
        Agent::Windsurf => home()?.join(".codeium/windsurf").join(name),
        _ => home()?.join(rel),
    })
}

/// `$COPILOT_HOME`, or `~/.copilot` when it is unset or empty.
pub(crate) fn copilot_home() -> Result<PathBuf, BoxError> {
    match std::env::var_os("COPILOT_HOME").filter(|h| !h.is_empty()) {
        Some(h) => Ok(PathBuf::from(h)),
        None => Ok(home()?.join(".copilot")),
    }
}

fn project_dir(project: &Path) -> Result<PathBuf, BoxError> {
    if !project.is_dir() {
        return Err(format!("connect: --project {}: not a directory", project.display()).into());
    }
    Ok(std::fs::canonicalize(project)?)
}

/// The workspace, what our entries run, and Codex's notify argv (absolute paths: config.toml
/// is the user's own).
fn hook_for(
    agent: Agent,
    scope: Scope,
    args: &ConnectArgs,
) -> Result<(PathBuf, Hook, Vec<String>), BoxError> {
    if !args.workspace.is_dir() {
        return Err(format!(
            "connect: workspace {} is not a directory (make it with `prx-hooks init {}`)",
            args.workspace.display(),
            args.workspace.display()
        )
        .into());
    }
    let ws = std::fs::canonicalize(&args.workspace)?;
    let here = this_program()?;
    let from = ["--from".to_string(), agent.name().to_string()];
    let absolute = scope == Scope::User || args.absolute;
    let argv: Vec<String> = [
        here.clone(),
        from.to_vec(),
        vec!["--workspace".into(), ws.to_string_lossy().into_owned()],
    ]
    .concat();
    let command = if absolute {
        quoted(&argv)
    } else {
        let project = project_dir(&args.project)?;
        let program = on_path()?;
        format!(
            "{} {} --workspace {}",
            quoted(&program),
            quoted(&from),
            relative_workspace(agent, &ws, &project)?
        )
    };
    let http = match &args.http {
        Some(url) => Some(http_url(url, &ws)?),
        None => None,
    };
    let policies = policies::wanted(agent, args.policies, args.on_unreachable, &ws)?;
    Ok((
        ws,
        Hook {
            command,
            http,
            policies,
        },
        argv,
    ))
}

fn quoted(words: &[String]) -> String {
    words
        .iter()
        .map(|w| agents::shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// This program as a command: `prx-hooks-send` beside it when it is there (it starts in half
/// the time, and the agent waits for every call: docs/ingest.md § Start-up), else itself and
/// `send`.
fn this_program() -> Result<Vec<String>, BoxError> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("connect: cannot find this program's own path: {e}"))?;
    let small = exe.with_file_name("prx-hooks-send");
    Ok(if small.is_file() {
        vec![small.to_string_lossy().into_owned()]
    } else {
        vec![exe.to_string_lossy().into_owned(), "send".into()]
    })
}

/// The program by name, as `PATH` finds it: `prx-hooks-send`, else `prx-hooks send`.
fn on_path() -> Result<Vec<String>, BoxError> {
    if find_on_path("prx-hooks-send").is_some() {
        return Ok(vec!["prx-hooks-send".into()]);
    }
    if find_on_path("prx-hooks").is_some() {
        return Ok(vec!["prx-hooks".into(), "send".into()]);
    }
    Err("connect: neither prx-hooks-send nor prx-hooks is on PATH: a project file names the program and each machine's PATH finds it. Install it (`cargo install --locked --path . --target-dir target` in this repository puts both in ~/.cargo/bin), or pass --absolute to write this machine's path (the file is then for this machine only), or use --scope user".into())
}

/// Where `PATH` finds the executable `name`.
pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The workspace as a shell word relative to the project: `"${CLAUDE_PROJECT_DIR:-.}"/ws`
/// (the agent sets the variable for its hooks; without it, the directory the hook runs in).
fn relative_workspace(agent: Agent, ws: &Path, project: &Path) -> Result<String, BoxError> {
    let var = agent.project_dir_var();
    if var.is_none() && !agent.runs_in_project() {
        return Err(format!(
            "connect {agent}: {} gives its hooks no project directory (they run in the session's directory): a project file would hold this machine's path to the workspace; pass --absolute, or use --scope user (the default)",
            agent.title()
        )
        .into());
    }
    let Ok(rel) = ws.strip_prefix(project) else {
        return Err(format!(
            "connect: the workspace {} is outside the project {}: a project file would hold this machine's path. Make the workspace inside the project (`prx-hooks init {}/prx`), or pass --absolute (the file is then for this machine only), or use --scope user",
            ws.display(),
            project.display(),
            project.display()
        )
        .into());
    };
    // Without a variable, the hook runs in the project's root.
    let base = var.map(|v| format!("\"${{{v}:-.}}\""));
    let rel = (!rel.as_os_str().is_empty()).then(|| agents::shell_quote(&rel.to_string_lossy()));
    Ok(match (base, rel) {
        (Some(base), Some(rel)) => format!("{base}/{rel}"),
        (Some(base), None) => base,
        (None, Some(rel)) => rel,
        (None, None) => ".".into(),
    })
}

/// Codex's config.toml with our `notify` set (with `--remove`: taken out), and how many of
/// our entries that replaced. A `notify` running another program is left alone by
/// `--remove`, and refused without `--force`.
fn edit_codex(
    old: &str,
    argv: &[String],
    args: &ConnectArgs,
    file: &Path,
) -> Result<(String, usize), Refusal> {
    let (mut doc, state) = agents::parse_toml(old, argv)?;
    let after = match (state, args.remove) {
        (Notify::Missing, true) => return Ok((old.to_string(), 0)),
        (Notify::Other { shown, .. }, true) => {
            note(format!(
                "{}: notify runs {shown}, not prx-hooks: left as it is",
                file.display()
            ));
            return Ok((old.to_string(), 0));
        }
        (Notify::Ours { .. }, true) => {
            doc.remove("notify");
            return Ok((doc.to_string(), 1));
        }
        (Notify::Ours { same: true }, false) => return Ok((old.to_string(), 0)),
        (Notify::Ours { same: false }, false) => (1, doc),
        (Notify::Missing, false) => (0, doc),
        (Notify::Other { shown, offset }, false) => {
            if !args.force {
                return Err(Refusal {
                    offset,
                    at: None,
                    reason: format!(
                        "notify already runs `{shown}`; Codex runs one notify program: pass --force to replace it (the old line stays in {}.prx-hooks.bak), make your program call `prx-hooks send --from codex` itself, or use Codex's hooks (connect codex without --notify)",
                        file.file_name()
                            .map_or(String::new(), |n| n.to_string_lossy().into_owned())
                    ),
                });
            }
            note(format!("--force: replacing notify = {shown}"));
            (1, doc)
        }
    };
    let (replaced, mut doc) = after;
    agents::set_notify(&mut doc, argv);
    Ok((doc.to_string(), replaced))
}

/// A settings file's edit: its text before (none: it did not exist) and after, how many of
/// our entries were replaced or taken out, and whether `--remove` took out some.
struct Change {
    before: Option<String>,
    after: String,
    replaced: usize,
    gone: bool,
}

/// Writes the change (the old file backed up first), shows it as a diff with `--dry-run`, or
/// says there is nothing to change; then what was done, on stdout. `None`: the file changed
/// before it could be written.
fn write_change(
    plan: &Plan,
    args: &ConnectArgs,
    change: &Change,
    current: &write::Current,
    gone: bool,
) -> Result<Option<ExitCode>, BoxError> {
    let (file, target) = (&plan.file, &plan.target);
    // Nothing of ours is left and the file is what we would have made from nothing: it was
    // ours alone (made by connect), so it goes; but a file reached through a link is the
    // user's (dotfiles): it stays, emptied.
    let linked = file != target;
    let delete = gone && !linked;
    let changed = match &change.before {
        _ if args.remove => change.replaced > 0,
        Some(b) => *b != change.after,
        None => true,
    };
    if args.dry_run {
        if changed {
            let new = if delete { "" } else { change.after.as_str() };
            let old = change.before.as_deref().unwrap_or("");
            let diff = write::unified_diff(old, new, &file.display().to_string());
            let _ = std::io::Write::write_all(&mut std::io::stdout(), diff.as_bytes());
        } else {
            note(format!("{}: nothing to change", file.display()));
        }
        return Ok(Some(ExitCode::SUCCESS));
    }
    if !changed {
        let what = if args.remove {
            "has none of our hooks"
        } else {
            "connected"
        };
        out!(
            "{}: {} already {what} (nothing written)",
            file.display(),
            plan.agent
        );
        if plan.agent == Agent::Codex && !args.notify && !args.remove {
            codex_notify_too();
        }
        return Ok(Some(ExitCode::SUCCESS));
    }
    // The backup sits beside the file named (not in a link's directory of dotfiles).
    // Staged first (the before-state is on disk before the file changes) and put in place
    // only once the file was written: an attempt the agent's own save undid leaves the backup
    // of the last change that happened.
    let backup = write::backup_path(file);
    let staged = match &change.before {
        Some(b) => Some(write::stage_backup(&backup, b, current.mode)?),
        None => None,
    };
    let outcome = if delete {
        write::remove_file(target, current)
    } else {
        write::replace_file(target, current, &change.after)
    };
    match (outcome, staged) {
        (Ok(write::Outcome::Written), Some(t)) => write::commit_backup(&t, &backup)?,
        (Ok(write::Outcome::Written), None) => {}
        (other, staged) => {
            if let Some(t) = staged {
                let _ = std::fs::remove_file(t);
            }
            other?;
            return Ok(None);
        }
    }
    let backup = change.before.as_ref().map(|_| backup);
    report(
        plan,
        args,
        change,
        backup.as_deref(),
        delete,
        gone && linked,
    );
    Ok(Some(ExitCode::SUCCESS))
}

/// What was done, on stdout (and what the user must do next, on stderr).
fn report(
    plan: &Plan,
    args: &ConnectArgs,
    change: &Change,
    backup: Option<&Path>,
    deleted: bool,
    emptied: bool,
) {
    let (agent, file) = (plan.agent, &plan.file);
    let backup = backup.map_or(String::new(), |b| format!(" (before: {})", b.display()));
    let n = change.replaced;
    let entries = |n: usize| format!("entr{}", if n == 1 { "y" } else { "ies" });
    if args.remove {
        let what = if deleted {
            "removed the file (it held only ours)".to_string()
        } else if emptied {
            format!(
                "took out {n} {}; {} holds no more than an empty settings object (the link stays)",
                entries(n),
                plan.target.display()
            )
        } else {
            format!("took out {n} {}", entries(n))
        };
        out!("{}: {what}{backup}", file.display());
        return;
    }
    let hook = plan.hook.as_ref();
    let what = match hook {
        Some(Hook {
            http: Some(url), ..
        }) => format!("http hook → {url}"),
        _ if args.notify => quoted(&plan.argv),
        Some(h) => h.command.clone(),
        None => String::new(),
    };
    let count = if args.notify {
        "notify".to_string()
    } else {
        format!("{} event(s)", plan.events.len())
    };
    out!("{}: {agent} {count} → {what}{backup}", file.display());
    out!("  the agent's hook format: {}", agent.docs());
    if n > 0 {
        out!("  {n} earlier prx-hooks {} replaced", entries(n));
    }
    if let Some(p) = hook.and_then(|h| h.policies) {
        let decides: Vec<&str> = plan
            .events
            .iter()
            .filter(|e| prx_hooks::policy::decision_point(agent.lib(), e.name).is_some())
            .map(|e| e.name)
            .collect();
        if !decides.is_empty() {
            out!(
                "  policies decide on {}: the agent waits for those entries; with no server: {}",
                decides.join(", "),
                match p.on_unreachable {
                    crate::send::OnUnreachable::Deny => "deny",
                    crate::send::OnUnreachable::None =>
                        "no decision (--on-unreachable deny to deny)",
                }
            );
        }
    }
    if plan.scope == Scope::Project && !args.absolute {
        out!(
            "  no path of this machine in it: the program is found on PATH, the workspace is relative to the project (the file can be committed)"
        );
    }
    next_steps(plan, args);
}

/// What the agent needs besides the file, on stderr.
fn next_steps(plan: &Plan, args: &ConnectArgs) {
    if let Some(Hook { http: Some(_), .. }) = &plan.hook {
        let kept: Vec<&str> = plan
            .events
            .iter()
            .filter(|e| !e.handlers.contains(Handlers::HTTP))
            .map(|e| e.name)
            .collect();
        if !kept.is_empty() {
            note(format!(
                "{} keep a command hook: Claude Code runs no http hook there",
                kept.join(" and ")
            ));
        }
        let token = plan
            .workspace
            .as_ref()
            .map(|w| w.join(prx_hooks::http::token::TOKEN_FILE));
        note(format!(
            "Claude Code fills $PRX_HOOKS_TOKEN from its own environment: export it before starting claude, e.g. export PRX_HOOKS_TOKEN=\"$(cat {})\"",
            token.map_or("<workspace>/.prx-hooks/token".into(), |t| {
                agents::shell_quote(&t.display().to_string())
            })
        ));
    }
    match plan.agent {
        Agent::GeminiCli => note(
            "Gemini CLI runs these unless hooksConfig.enabled is false in its settings (hooksConfig.disabled names hooks it skips); in a folder it does not trust it skips every settings hook, the user's too: trust the folder when Gemini asks (it keeps the answer in ~/.gemini/trustedFolders.json)",
        ),
        Agent::QwenCode => note(
            "Qwen Code runs a project's hooks only in a folder it trusts (trust it when Qwen asks), and none at all while disableAllHooks is true in its settings",
        ),
        Agent::CopilotCli => note(
            "Copilot CLI runs a repository's .github/hooks only in a folder it trusts (trust it when Copilot asks: trustedFolders in ~/.copilot/config.json), and only when started in the repository's root",
        ),
        Agent::Codex if args.notify => note(
            "Codex calls notify after each turn (agent-turn-complete) only; its hooks (connect codex without --notify) also see tools and sessions",
        ),
        Agent::Codex => {
            note(
                "Codex runs a hook only once you trust it: start codex, type /hooks and trust the prx-hooks entries (Codex asks again whenever an entry changes), or run codex --dangerously-bypass-hook-trust where every hook source is vetted",
            );
            if plan.scope == Scope::Project {
                note("a project's .codex/hooks.json runs only in a project Codex trusts");
            }
            codex_notify_too();
        }
        _ => {}
    }
}

/// A `notify` of ours still in config.toml would deliver each turn a second time.
fn codex_notify_too() {
    let Ok(config) = codex_home().map(|h| h.join("config.toml")) else {
        return;
    };
    let Ok(text) = std::fs::read_to_string(&config) else {
        return;
    };
    if let Ok((_, Notify::Ours { .. })) = agents::parse_toml(&text, &[]) {
        note(format!(
            "{} still runs our notify: each turn would arrive twice; take it out with `prx-hooks connect codex --notify --remove`",
            config.display()
        ));
    }
}

/// The http hook's URL: `URL/api/ingest/claude-code`, URL given or read from the workspace's
/// address file (a TCP address only: Claude Code posts over TCP).
fn http_url(given: &str, ws: &Path) -> Result<String, BoxError> {
    let base = if given.is_empty() {
        match prx_hooks::http::token::read_address(ws)? {
            Some(a) if a.starts_with("http://") || a.starts_with("https://") => a,
            Some(a) => {
                return Err(format!(
                    "connect --http: the server of {} listens on {a}, a unix socket: Claude Code's http hooks need TCP: start it with `prx-hooks run --listen 127.0.0.1:PORT`, or pass --http http://HOST:PORT, or leave --http out (a command hook reaches unix sockets)",
                    ws.display()
                )
                .into());
            }
            None => {
                return Err(format!(
                    "connect --http: no running server in {} ({} is missing): start `prx-hooks run --workspace {} --listen 127.0.0.1:7878`, or pass --http http://HOST:PORT",
                    ws.display(),
                    ws.join(prx_hooks::http::token::ADDRESS_FILE).display(),
                    agents::shell_quote(&ws.display().to_string())
                )
                .into());
            }
        }
    } else {
        given.to_string()
    };
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(format!("connect --http: {base:?}: expected http://HOST:PORT[/PREFIX]").into());
    }
    Ok(format!(
        "{}/api/ingest/claude-code",
        base.trim_end_matches('/')
    ))
}
