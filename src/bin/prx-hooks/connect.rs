//! `prx-hooks connect AGENT`: our hook entries written into an agent's own settings.
//!
//! The entries make Claude Code, Codex, Gemini CLI or Cursor feed a workspace's server
//! (docs/connect.md).
//!
//! The user's settings stay byte for byte: JSON is edited at the spans of the members and
//! elements that change ([`json`], connect_json.rs), Codex's TOML through `toml_edit`, which
//! keeps comments and layout. Our entries are found again by what they run ([`agents`]), so
//! `connect` twice writes nothing the second time and `--remove` takes out exactly ours. A
//! changed file is backed up first (`<file>.prx-hooks.bak`), then replaced whole: a
//! temporary file in the same directory, synced, renamed over it with the old file's mode.

#[path = "connect_agents.rs"]
mod agents;
#[path = "connect_json.rs"]
mod json;

use crate::BoxError;
use agents::{Agent, Hook, Notify, Refusal, Want};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args)]
#[command(after_help = "\
Files (project scope: in --project, default the current directory; user scope: in $HOME):
  claude-code  .claude/settings.json   a command hook (async) per event, or with --http an http hook
  codex        .codex/config.toml      notify = [<this binary>, \"send\", \"--from\", \"codex\", ...]
                                       (user scope only: Codex ignores notify in a project; $CODEX_HOME is honoured)
  gemini-cli   .gemini/settings.json   a command hook per event
  cursor       .cursor/hooks.json      a command hook per event

Exit codes:
  0  connected, removed, or nothing to change (with --dry-run: the diff is on stdout)
  2  nothing written: a usage error, a settings file that is not valid JSON/TOML
     (FILE:LINE:COL: reason), a value of the wrong shape (FILE:LINE:COL: path: reason),
     Codex's notify already running another program (without --force), no TCP address for
     --http, or an I/O error")]
pub(crate) struct ConnectArgs {
    /// The agent: claude-code, codex, gemini-cli or cursor.
    #[arg(value_name = "AGENT")]
    agent: String,
    /// The workspace the agent's events go to (its server's .prx-hooks/address and token, its
    /// spool); written into the hook as an absolute path.
    #[arg(long, default_value = ".")]
    workspace: PathBuf,
    /// project: the settings file in --project; user: the one in $HOME. Default: project
    /// (user for codex).
    #[arg(long, value_enum)]
    scope: Option<Scope>,
    /// The project whose settings to edit (project scope).
    #[arg(long, value_name = "DIR", default_value = ".")]
    project: PathBuf,
    /// Print what would change as a diff (-/+ lines) and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Take our entries out again (only ours; the user's stay).
    #[arg(long)]
    remove: bool,
    /// Claude Code only: an http hook posting to URL/api/ingest/claude-code instead of a
    /// command (URL default: the workspace's running server, when it listens on TCP).
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    http: Option<String>,
    /// Only these events (comma-separated; default every event the agent documents).
    #[arg(long, value_name = "EVENT,…", value_delimiter = ',')]
    events: Vec<String>,
    /// Codex: replace a notify program that is not ours (it stays in the backup).
    #[arg(long)]
    force: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scope {
    Project,
    User,
}

/// Settings files larger than this are refused (they are a few KiB).
const MAX_SETTINGS_BYTES: u64 = 16 << 20;

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

/// `connect`: checks the flags, makes the hook entry, edits the settings file at the spans
/// that change, and writes it (backed up first) or, with `--dry-run`, shows the diff.
pub(crate) fn connect(args: ConnectArgs) -> Result<ExitCode, BoxError> {
    let (agent, scope) = agent_and_scope(&args)?;
    let events = pick_events(agent, &args)?;
    let file = settings_path(agent, scope, &args)?;
    let (workspace, argv, hook) = hook_for(agent, &args)?;

    // The file as it is (a link is followed: the file it points to is edited, the link stays).
    let target = match std::fs::symlink_metadata(&file) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(&file)
            .map_err(|e| format!("connect: {} is a link to nothing: {e}", file.display()))?,
        _ => file.clone(),
    };
    let before = read_settings(&target)?;
    let old = before.as_deref().unwrap_or(agent.skeleton());
    let old = if old.trim().is_empty() && agent != Agent::Codex {
        agent.skeleton()
    } else {
        old
    };

    let edited = if agent == Agent::Codex {
        edit_codex(old, &argv, &args, &file)
    } else {
        let want = if args.remove {
            Want::Remove
        } else {
            Want::Connect {
                events: &events,
                entry: agents::entry(agent, &hook),
            }
        };
        agents::apply_json(old, agent, &want)
    };
    let (after, replaced) = match edited {
        Ok(edited) => edited,
        Err(r) => return Ok(refused(&file, old, &r)),
    };
    let change = Change {
        file,
        target,
        before,
        after,
        replaced,
    };
    write_change(agent, &args, &change, &events, &hook, workspace.as_deref())
}

/// The agent, and the scope (default: project, user for Codex); the flags that do not go
/// with them are refused.
fn agent_and_scope(args: &ConnectArgs) -> Result<(Agent, Scope), BoxError> {
    let Some(agent) = Agent::from_name(&args.agent) else {
        return Err(format!(
            "connect: unknown agent {:?}: claude-code, codex, gemini-cli or cursor",
            args.agent
        )
        .into());
    };
    let scope = args.scope.unwrap_or(if agent == Agent::Codex {
        Scope::User
    } else {
        Scope::Project
    });
    if agent == Agent::Codex && scope == Scope::Project {
        return Err("connect codex: Codex ignores `notify` in a project's .codex/config.toml (it runs machine-local commands only from ~/.codex/config.toml): use --scope user".into());
    }
    if args.http.is_some() && agent != Agent::ClaudeCode {
        return Err(format!(
            "connect {}: --http is for Claude Code only (its `http` hook type); {} runs command hooks: leave --http out",
            agent.name(),
            agent.name()
        )
        .into());
    }
    if args.http.is_some() && args.remove {
        return Err(
            "connect: --remove takes out our entries whatever they are; leave --http out".into(),
        );
    }
    if args.force && agent != Agent::Codex {
        return Err("connect: --force is for codex (its one notify program)".into());
    }
    Ok((agent, scope))
}

/// `--events`, each checked against the agent's documented events; default all of them.
fn pick_events(agent: Agent, args: &ConnectArgs) -> Result<Vec<&'static str>, BoxError> {
    if args.events.is_empty() {
        return Ok(agent.events());
    }
    if agent == Agent::Codex {
        return Err(
            "connect codex: --events does not apply: Codex's notify has no events to pick".into(),
        );
    }
    let mut picked = Vec::new();
    for e in &args.events {
        match agent.events().iter().find(|k| *k == e) {
            Some(k) => picked.push(*k),
            None => {
                return Err(format!(
                    "connect {}: --events: unknown event {e:?}; the documented ones: {}",
                    agent.name(),
                    agent.events().join(", ")
                )
                .into());
            }
        }
    }
    Ok(picked)
}

/// The settings file to edit: in `--project` or in the user's directory.
fn settings_path(agent: Agent, scope: Scope, args: &ConnectArgs) -> Result<PathBuf, BoxError> {
    let base = match scope {
        Scope::Project => {
            if !args.project.is_dir() {
                return Err(format!(
                    "connect: --project {}: not a directory",
                    args.project.display()
                )
                .into());
            }
            std::fs::canonicalize(&args.project)?
        }
        Scope::User => user_dir(agent)?,
    };
    Ok(match (agent, scope) {
        (Agent::Codex, Scope::User) if std::env::var_os("CODEX_HOME").is_some() => {
            base.join("config.toml")
        }
        _ => base.join(agent.settings_file()),
    })
}

/// The workspace (none with `--remove`), the `send` command line that feeds it, and the
/// hook entry: that command, or with `--http` the URL.
fn hook_for(
    agent: Agent,
    args: &ConnectArgs,
) -> Result<(Option<PathBuf>, Vec<String>, Hook), BoxError> {
    let workspace = if args.remove {
        None
    } else {
        if !args.workspace.is_dir() {
            return Err(format!(
                "connect: workspace {} is not a directory (make it with `prx-hooks init {}`)",
                args.workspace.display(),
                args.workspace.display()
            )
            .into());
        }
        Some(std::fs::canonicalize(&args.workspace)?)
    };
    let exe = std::env::current_exe()
        .map_err(|e| format!("connect: cannot find this program's own path: {e}"))?;
    // `prx-hooks-send` beside this program starts faster than `prx-hooks send`: the agent
    // waits for every call (docs/ingest.md § Start-up).
    let small = exe.with_file_name("prx-hooks-send");
    let command = if small.is_file() {
        vec![small.to_string_lossy().into_owned()]
    } else {
        vec![exe.to_string_lossy().into_owned(), "send".into()]
    };
    let argv: Vec<String> = match &workspace {
        Some(ws) => [
            command,
            vec![
                "--from".into(),
                agent.name().into(),
                "--workspace".into(),
                ws.to_string_lossy().into_owned(),
            ],
        ]
        .concat(),
        None => Vec::new(),
    };
    let hook = match (&args.http, &workspace) {
        (Some(url), Some(ws)) => Hook::Http(http_url(url, ws)?),
        _ => Hook::Command(
            argv.iter()
                .map(|w| agents::shell_quote(w))
                .collect::<Vec<_>>()
                .join(" "),
        ),
    };
    Ok((workspace, argv, hook))
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
    let mut replaced = 0;
    let (mut doc, state) = agents::parse_toml(old, argv)?;
    let after = match (state, args.remove) {
        (Notify::Missing, true) => old.to_string(),
        (Notify::Other { shown, .. }, true) => {
            note(format!(
                "{}: notify runs {shown}, not prx-hooks: left as it is",
                file.display()
            ));
            old.to_string()
        }
        (Notify::Ours { .. }, true) => {
            replaced += 1;
            doc.remove("notify");
            doc.to_string()
        }
        (Notify::Ours { same: true }, false) => old.to_string(),
        (Notify::Ours { same: false }, false) | (Notify::Missing, false) => {
            set_notify_counted(&mut doc, argv, &mut replaced, false);
            doc.to_string()
        }
        (Notify::Other { shown, offset }, false) => {
            if !args.force {
                return Err(Refusal {
                    offset,
                    at: None,
                    reason: format!(
                        "notify already runs `{shown}`; Codex runs one notify program: pass --force to replace it (the old line stays in {}.prx-hooks.bak), or make your program call `prx-hooks send --from codex` itself",
                        file.file_name()
                            .map_or(String::new(), |n| n.to_string_lossy().into_owned())
                    ),
                });
            }
            note(format!("--force: replacing notify = {shown}"));
            set_notify_counted(&mut doc, argv, &mut replaced, true);
            doc.to_string()
        }
    };
    Ok((after, replaced))
}

/// A settings file's edit: the file named (`file`), the one written (`target`, a link
/// followed), its text before (none: it did not exist) and after, and how many of our
/// entries were replaced or taken out.
struct Change {
    file: PathBuf,
    target: PathBuf,
    before: Option<String>,
    after: String,
    replaced: usize,
}

/// Writes the change (the old file backed up first), shows it as a diff with `--dry-run`, or
/// says there is nothing to change; then what was done, on stdout.
fn write_change(
    agent: Agent,
    args: &ConnectArgs,
    change: &Change,
    events: &[&str],
    hook: &Hook,
    workspace: Option<&Path>,
) -> Result<ExitCode, BoxError> {
    let Change {
        file,
        target,
        before,
        after,
        replaced,
    } = change;
    let replaced = *replaced;
    // Nothing of ours is left and the file is what we would have made from nothing: it was
    // ours alone (made by connect), so it goes.
    let delete = args.remove && replaced > 0 && before.is_some() && after == agent.skeleton();
    let changed = match before {
        _ if args.remove => replaced > 0,
        Some(b) => b != after,
        None => true,
    };
    if args.dry_run {
        if changed {
            let shown = file.display().to_string();
            let new = if delete { "" } else { after.as_str() };
            let diff = unified_diff(before.as_deref().unwrap_or(""), new, &shown);
            let _ = std::io::Write::write_all(&mut std::io::stdout(), diff.as_bytes());
        } else {
            note(format!("{}: nothing to change", file.display()));
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !changed {
        out!(
            "{}: {} already {} (nothing written)",
            file.display(),
            agent.name(),
            if args.remove {
                "has none of our hooks"
            } else {
                "connected"
            }
        );
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(b) = before {
        write_backup(target, b)?;
    }
    if delete {
        std::fs::remove_file(target)
            .map_err(|e| format!("connect: removing {}: {e}", target.display()))?;
    } else {
        write_atomic(target, after, before.as_deref())?;
    }
    report(
        agent,
        file,
        args,
        events,
        hook,
        replaced,
        before.is_some(),
        delete,
        workspace,
    );
    Ok(ExitCode::SUCCESS)
}

fn set_notify_counted(doc: &mut toml_edit::DocumentMut, argv: &[String], n: &mut usize, was: bool) {
    if was || doc.get("notify").is_some() {
        *n += 1;
    }
    agents::set_notify(doc, argv);
}

/// What was done, on stdout.
#[allow(clippy::too_many_arguments)]
fn report(
    agent: Agent,
    file: &Path,
    args: &ConnectArgs,
    events: &[&str],
    hook: &Hook,
    replaced: usize,
    existed: bool,
    deleted: bool,
    workspace: Option<&Path>,
) {
    let backup = if existed {
        format!(" (before: {})", backup_path(file).display())
    } else {
        String::new()
    };
    if args.remove {
        let what = if deleted {
            "removed the file (it held only ours)".to_string()
        } else {
            format!(
                "took out {replaced} entr{}",
                if replaced == 1 { "y" } else { "ies" }
            )
        };
        out!("{}: {what}{backup}", file.display());
        return;
    }
    let what = match hook {
        Hook::Http(url) => format!("http hook → {url}"),
        Hook::Command(cmd) => cmd.clone(),
    };
    let count = if agent == Agent::Codex {
        "notify".to_string()
    } else {
        format!("{} event(s)", events.len())
    };
    out!(
        "{}: {} {count} → {what}{backup}",
        file.display(),
        agent.name()
    );
    out!("  the agent's hook format: {}", agent.docs());
    if replaced > 0 {
        out!(
            "  {replaced} earlier prx-hooks entr{} replaced",
            if replaced == 1 { "y" } else { "ies" }
        );
    }
    if let Hook::Http(_) = hook {
        let token = workspace.map(|w| w.join(prx_hooks::http::token::TOKEN_FILE));
        say!(
            "prx-hooks connect: Claude Code fills $PRX_HOOKS_TOKEN from its own environment: export it before starting claude, e.g. export PRX_HOOKS_TOKEN=\"$(cat {})\"",
            token.map_or("<workspace>/.prx-hooks/token".into(), |t| {
                agents::shell_quote(&t.display().to_string())
            })
        );
    }
    match agent {
        Agent::GeminiCli => note(
            "Gemini CLI runs hooks only with its hooks system on (/settings → Advanced → Enable Hooks System), and project hooks only in a trusted folder",
        ),
        Agent::Codex => note("Codex calls notify after each turn (agent-turn-complete)"),
        _ => {}
    }
}

/// `$HOME` (or, for Codex, `$CODEX_HOME` itself).
fn user_dir(agent: Agent) -> Result<PathBuf, BoxError> {
    if agent == Agent::Codex
        && let Some(h) = std::env::var_os("CODEX_HOME").filter(|h| !h.is_empty())
    {
        return Ok(PathBuf::from(h));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(h) => Ok(PathBuf::from(h)),
        None => Err("connect: --scope user: $HOME is not set".into()),
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

/// The settings file's text; `None` when it does not exist.
fn read_settings(path: &Path) -> Result<Option<String>, BoxError> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("connect: {}: {e}", path.display()).into()),
    };
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(format!("connect: {}: not a regular file", path.display()).into());
    }
    if meta.len() > MAX_SETTINGS_BYTES {
        return Err(format!(
            "connect: {}: {} bytes, over {MAX_SETTINGS_BYTES}: not a settings file",
            path.display(),
            meta.len()
        )
        .into());
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(f, MAX_SETTINGS_BYTES + 1),
        &mut bytes,
    )?;
    match String::from_utf8(bytes) {
        Ok(s) => Ok(Some(s)),
        Err(e) => {
            let text =
                String::from_utf8_lossy(&e.as_bytes()[..e.utf8_error().valid_up_to()]).into_owned();
            let (line, col) = json::line_col(&text, text.len());
            Err(format!(
                "{}:{line}:{col}: not UTF-8 text (nothing was changed)",
                path.display()
            )
            .into())
        }
    }
}

/// `<file>.prx-hooks.bak`.
fn backup_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".prx-hooks.bak");
    file.with_file_name(name)
}

/// The file's content before the change, next to it (same mode, written like the file).
fn write_backup(target: &Path, text: &str) -> Result<(), BoxError> {
    let path = backup_path(target);
    // The backup takes the settings file's mode (it may hold secrets).
    let mode = std::fs::metadata(target)
        .map(|m| m.mode() & 0o777 & !0o002)
        .ok();
    write_file(&path, text, mode, None).map_err(|e| format!("connect: the backup: {e}").into())
}

/// Replaces `path` (whose content was `was`, `None`: missing) with `text`, keeping its mode
/// (without write for others) or, new, 0644 less the umask.
fn write_atomic(path: &Path, text: &str, was: Option<&str>) -> Result<(), BoxError> {
    let mode = match (was, std::fs::metadata(path)) {
        (Some(_), Ok(m)) => {
            let mode = m.mode() & 0o7777;
            if mode & 0o002 != 0 {
                note(format!(
                    "{}: was writable by anyone; written without that",
                    path.display()
                ));
            }
            Some(mode & !0o002)
        }
        _ => None,
    };
    write_file(path, text, mode, Some(was))
}

/// Writes `path` whole: a temporary file in the same directory (0600 while written), synced,
/// given `mode` (default 0644 less the umask), renamed over it, and the directory synced.
/// Missing directories are made (0755 less the umask). With `expect`, the file must still
/// hold that (`None`: still be missing) just before the rename: a change made meanwhile (the
/// agent saving its settings) is never overwritten.
fn write_file(
    path: &Path,
    text: &str,
    mode: Option<u32>,
    expect: Option<Option<&str>>,
) -> Result<(), BoxError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| format!("connect: making {}: {e}", dir.display()))?;
    let name = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(
        ".{name}.prx-hooks-{}-{stamp:08x}.tmp",
        std::process::id()
    ));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(
                nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_CLOEXEC.bits(),
            )
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        let mode = match mode {
            Some(m) => m,
            // A new file: what the agent's own write would give it (0644 less the umask).
            None => 0o644 & !umask(),
        };
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        if let Some(expect) = expect {
            let now = match std::fs::read(path) {
                Ok(b) => Some(b),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            if now.as_deref() != expect.map(str::as_bytes) {
                return Err(std::io::Error::other(
                    "it changed while connect ran (nothing was written; run connect again)",
                ));
            }
        }
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("connect: writing {}: {e}", path.display()).into());
    }
    Ok(())
}

/// The process's umask (set and put back at once; `connect` runs no other thread).
fn umask() -> u32 {
    use nix::sys::stat::{Mode, umask};
    let old = umask(Mode::from_bits_truncate(0o077));
    umask(old);
    old.bits()
}

/// A unified diff of `old` → `new` (3 lines of context), headed `--- FILE` / `+++ FILE`.
fn unified_diff(old: &str, new: &str, name: &str) -> String {
    let a: Vec<&str> = old.split_inclusive('\n').collect();
    let b: Vec<&str> = new.split_inclusive('\n').collect();
    // Common prefix and suffix first: the changes are few and local.
    let pre = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let suf = a[pre..]
        .iter()
        .rev()
        .zip(b[pre..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (am, bm) = (&a[pre..a.len() - suf], &b[pre..b.len() - suf]);
    // The middle by longest common subsequence (bounded; else all of it as changed).
    let mut ops: Vec<(char, &str)> = Vec::new();
    if am.len().saturating_mul(bm.len()) <= 4_000_000 {
        let (n, m) = (am.len(), bm.len());
        let mut lcs = vec![0u32; (n + 1) * (m + 1)];
        for i in (0..n).rev() {
            for j in (0..m).rev() {
                lcs[i * (m + 1) + j] = if am[i] == bm[j] {
                    lcs[(i + 1) * (m + 1) + j + 1] + 1
                } else {
                    lcs[(i + 1) * (m + 1) + j].max(lcs[i * (m + 1) + j + 1])
                };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < n || j < m {
            if i < n && j < m && am[i] == bm[j] {
                ops.push((' ', am[i]));
                i += 1;
                j += 1;
            } else if i < n && (j == m || lcs[(i + 1) * (m + 1) + j] >= lcs[i * (m + 1) + j + 1]) {
                // A changed line shows as `-old` then `+new`.
                ops.push(('-', am[i]));
                i += 1;
            } else {
                ops.push(('+', bm[j]));
                j += 1;
            }
        }
    } else {
        ops.extend(am.iter().map(|l| ('-', *l)));
        ops.extend(bm.iter().map(|l| ('+', *l)));
    }
    let mut all: Vec<(char, &str)> = a[..pre].iter().map(|l| (' ', *l)).collect();
    all.extend(ops);
    all.extend(a[a.len() - suf..].iter().map(|l| (' ', *l)));

    let mut out = format!("--- {name}\n+++ {name}\n");
    const CONTEXT: usize = 3;
    let changed: Vec<usize> = (0..all.len()).filter(|&k| all[k].0 != ' ').collect();
    let mut k = 0;
    while k < changed.len() {
        // A hunk: changes closer than 2×CONTEXT lines apart go together.
        let first = changed[k];
        let mut last = first;
        while k + 1 < changed.len() && changed[k + 1] <= last + 2 * CONTEXT + 1 {
            k += 1;
            last = changed[k];
        }
        k += 1;
        let from = first.saturating_sub(CONTEXT);
        let to = (last + CONTEXT + 1).min(all.len());
        let (mut a_line, mut b_line) = (1, 1);
        for (op, _) in &all[..from] {
            match op {
                '-' => a_line += 1,
                '+' => b_line += 1,
                _ => {
                    a_line += 1;
                    b_line += 1;
                }
            }
        }
        let a_len = all[from..to].iter().filter(|(op, _)| *op != '+').count();
        let b_len = all[from..to].iter().filter(|(op, _)| *op != '-').count();
        let start = |line: usize, len: usize| if len == 0 { line - 1 } else { line };
        out.push_str(&format!(
            "@@ -{},{a_len} +{},{b_len} @@\n",
            start(a_line, a_len),
            start(b_line, b_len)
        ));
        for (op, line) in &all[from..to] {
            out.push(*op);
            out.push_str(line);
            if !line.ends_with('\n') {
                out.push_str("\n\\ No newline at end of file\n");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unified_diff;

    #[test]
    fn the_diff_shows_only_the_changed_lines_with_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let new = "a\nb\nc\nd\nX\ne\nf\ng\nh\n";
        let d = unified_diff(old, new, "f.json");
        assert_eq!(
            d,
            "--- f.json\n+++ f.json\n@@ -2,6 +2,7 @@\n b\n c\n d\n+X\n e\n f\n g\n"
        );
        // A new file: every line added.
        let d = unified_diff("", "{}\n", "n.json");
        assert_eq!(d, "--- n.json\n+++ n.json\n@@ -0,0 +1,1 @@\n+{}\n");
    }
}
