//! `prx-hooks init` as a real process (docs/cli.md § `init`): the workspace it makes validates
//! (strictly) and runs its sample events through its real hooks; it never overwrites anything,
//! a symbolic link included, and names everything that is in the way.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

fn prx(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_prx-hooks"))
        .args(args)
        .current_dir(cwd)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn init_makes_a_workspace_that_validates_strictly_and_runs_its_sample_events() {
    let root = tempfile::tempdir().unwrap();
    let out = prx(&["init", "deep/ws"], root.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("prx-hooks validate --workspace deep/ws"),
        "{stdout}"
    );
    let ws = root.path().join("deep/ws");
    for (name, mode) in [
        ("hooks.json", 0o600),
        ("hooks/log-event.sh", 0o755),
        ("hooks/notify.sh", 0o755),
        ("events.ndjson", 0o644),
        ("README.md", 0o644),
        (".gitignore", 0o644),
    ] {
        let m = std::fs::metadata(ws.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = m.permissions().mode() & 0o777;
        if mode == 0o644 {
            // Plain files follow the umask; none is writable by others.
            assert_eq!((got & 0o600, got & 0o022), (0o600, 0), "{name}: {got:o}");
        } else {
            assert_eq!(got, mode, "{name}: {got:o}");
        }
    }
    let gitignore = std::fs::read_to_string(ws.join(".gitignore")).unwrap();
    assert!(
        gitignore.lines().any(|l| l == ".prx-hooks/") && gitignore.lines().any(|l| l == "logs/")
    );
    let readme = std::fs::read_to_string(ws.join("README.md")).unwrap();
    for id in ["audit-tool-calls", "notify-agent-end", "errors-to-file"] {
        assert!(readme.contains(id), "the README explains {id}");
    }

    let out = prx(
        &["validate", "--strict", "--workspace", "deep/ws"],
        root.path(),
    );
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("ok: 3 hook(s), 3 enabled, 0 warning(s)"),
        "{}",
        text(&out.stderr)
    );

    let out = prx(
        &[
            "run",
            "--workspace",
            "deep/ws",
            "--events",
            "deep/ws/events.ndjson",
        ],
        root.path(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let audit = lines(&ws.join("logs/audit.log"));
    assert_eq!(
        audit.len(),
        2,
        "shell and the MCP tool, not read_file: {audit:?}"
    );
    assert!(
        audit
            .iter()
            .any(|l| l.contains("tool_call_start coder/demo-1")
                && l.contains(r#""cmd":"cargo test""#))
    );
    assert!(
        audit
            .iter()
            .any(|l| l.contains("mcp__github__create_issue"))
    );
    assert!(!audit.iter().any(|l| l.contains("read_file")));
    let errors = lines(&ws.join("logs/errors.log"));
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains(r#"{"component":"tool","message":"shell exited with status 101"}"#));
    let notes = lines(&ws.join("logs/notifications.log"));
    assert_eq!(notes.len(), 1);
    assert!(
        notes[0].ends_with(r#"agent coder/demo-1 finished: {"success":true,"messages_count":9}"#),
        "{notes:?}"
    );
}

#[test]
fn init_refuses_to_overwrite_anything_names_all_that_exists_and_writes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("hooks.json"), "{\"hooks\": {}}\n").unwrap();
    let elsewhere = root.path().join("elsewhere.md");
    std::fs::write(&elsewhere, "mine").unwrap();
    std::os::unix::fs::symlink(&elsewhere, ws.join("README.md")).unwrap();
    let out = prx(&["init", "ws"], root.path());
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("refusing to overwrite")
            && err.contains("ws/hooks.json")
            && err.contains("ws/README.md"),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
    assert_eq!(
        std::fs::read_to_string(ws.join("hooks.json")).unwrap(),
        "{\"hooks\": {}}\n"
    );
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "mine");
    let mut left: Vec<String> = std::fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["README.md", "hooks.json"],
        "nothing else was created"
    );

    // A second init over a workspace init made refuses as well and changes nothing.
    let out = prx(&["init", "fresh"], root.path());
    assert!(out.status.success());
    let before = std::fs::read(root.path().join("fresh/hooks.json")).unwrap();
    std::fs::write(
        root.path().join("fresh/hooks/notify.sh"),
        "#!/bin/sh\n# mine\n",
    )
    .unwrap();
    let out = prx(&["init", "fresh"], root.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("fresh/hooks/notify.sh"));
    assert_eq!(
        std::fs::read(root.path().join("fresh/hooks.json")).unwrap(),
        before
    );
    assert_eq!(
        std::fs::read_to_string(root.path().join("fresh/hooks/notify.sh")).unwrap(),
        "#!/bin/sh\n# mine\n"
    );
}

#[test]
fn init_names_an_existing_hooks_directory_or_link_in_its_refusal_and_writes_nothing() {
    let root = tempfile::tempdir().unwrap();
    // A directory.
    std::fs::create_dir_all(root.path().join("wsE/hooks")).unwrap();
    let out = prx(&["init", "wsE"], root.path());
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("refusing to overwrite what exists: wsE/hooks")
            && err.contains("nothing was written"),
        "{err}"
    );
    assert!(!err.contains("os error"), "{err}");
    let left: Vec<_> = std::fs::read_dir(root.path().join("wsE"))
        .unwrap()
        .collect();
    assert_eq!(left.len(), 1, "only hooks/ is there");
    // A symbolic link to a directory elsewhere, which holds one of the scripts' names: both
    // named, nothing written through the link or beside it.
    let elsewhere = root.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("notify.sh"), "mine").unwrap();
    std::fs::create_dir(root.path().join("wsL")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.path().join("wsL/hooks")).unwrap();
    let out = prx(&["init", "wsL"], root.path());
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("wsL/hooks, wsL/hooks/notify.sh") && !err.contains("os error"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 1);
    assert_eq!(
        std::fs::read_dir(root.path().join("wsL")).unwrap().count(),
        1
    );
}

#[test]
fn init_readme_quotes_the_workspace_like_its_hints_and_its_commands_run_as_pasted() {
    let root = tempfile::tempdir().unwrap();
    let dir = "my ws/$(touch pwned)'x";
    let out = prx(&["init", dir], root.path());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let hint = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("prx-hooks validate --workspace "))
        .unwrap()
        .to_string();
    assert_eq!(hint, r"'my ws/$(touch pwned)'\''x'");
    let readme = std::fs::read_to_string(root.path().join(dir).join("README.md")).unwrap();
    let commands: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("prx-hooks validate") || l.contains(" --events "))
        .collect();
    assert_eq!(commands.len(), 2, "{readme}");
    assert!(
        commands[0].starts_with(&format!("prx-hooks validate --workspace {hint} ")),
        "{}",
        commands[0]
    );
    assert!(
        commands[1].starts_with(&format!(
            r"prx-hooks run --workspace {hint} --events 'my ws/$(touch pwned)'\''x/events.ndjson' --print"
        )),
        "{}",
        commands[1]
    );
    // Pasted into a shell as they are, they act on that workspace and run nothing else.
    for c in commands {
        let line = c.replacen(
            "prx-hooks",
            &format!("'{}'", env!("CARGO_BIN_EXE_prx-hooks")),
            1,
        );
        let out = Command::new("sh")
            .args(["-c", &line])
            .current_dir(root.path())
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert!(out.status.success(), "{line}: {}", text(&out.stderr));
    }
    assert!(!root.path().join("pwned").exists(), "$(…) never ran");
    assert!(root.path().join(dir).join("logs/errors.log").exists());
}

/// Every entry of `dir`, sorted (empty when `dir` does not exist).
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// What `init` leaves after a crash besides the whole workspace or nothing: its own temporary
/// directory, which the next `init` cleans.
fn is_init_temp(name: &str) -> bool {
    name.starts_with(".prx-hooks-init-")
}

/// Swaps every real `hooks` directory it finds up to three levels below `root` (a workspace,
/// or a temporary directory init works in) for a symbolic link to `outside`, as fast as it
/// can, until `stop`; returns how many it swapped.
fn swap_hooks_for_links(root: &Path, outside: &Path, stop: &std::sync::atomic::AtomicBool) -> u64 {
    use std::sync::atomic::Ordering;
    let mut swaps = 0u64;
    let dirs_in = |p: &Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(p)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter(|e| !e.file_name().to_string_lossy().starts_with("hooks"))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    while !stop.load(Ordering::Relaxed) {
        for top in dirs_in(root) {
            let mut candidates = vec![top.join("hooks")];
            candidates.extend(dirs_in(&top).into_iter().map(|d| d.join("hooks")));
            for h in candidates {
                if h.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                    let moved = h.with_file_name(format!("hooks.moved-{swaps}"));
                    if std::fs::rename(&h, &moved).is_ok() {
                        let _ = std::os::unix::fs::symlink(outside, &h);
                        swaps += 1;
                    }
                }
            }
        }
    }
    swaps
}

#[test]
fn init_never_writes_outside_while_a_racing_thread_swaps_hooks_for_a_symlink() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("sentinel"), "mine").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let racer = {
        let (root, outside, stop) = (
            root.path().to_path_buf(),
            outside.path().to_path_buf(),
            stop.clone(),
        );
        std::thread::spawn(move || swap_hooks_for_links(&root, &outside, &stop))
    };
    let runs = 120;
    let (mut ok, mut refused) = (0, 0);
    for n in 0..runs {
        let name = format!("ws-{n}");
        if n % 2 == 1 {
            // An existing, empty directory as well as a missing one.
            std::fs::create_dir(root.path().join(&name)).unwrap();
        }
        let out = prx(&["init", &name], root.path());
        match out.status.code() {
            Some(0) => ok += 1,
            Some(2) => refused += 1,
            other => panic!("init {name}: {other:?}: {}", text(&out.stderr)),
        }
        assert_eq!(
            entries(outside.path()),
            ["sentinel"],
            "init {name} wrote through the link: {}",
            text(&out.stderr)
        );
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = racer.join().unwrap();
    eprintln!("{runs} inits: {ok} made a workspace, {refused} refused; {swaps} hooks/ swapped");
    assert!(swaps > 0, "the race was never run");
    assert_eq!(
        std::fs::read_to_string(outside.path().join("sentinel")).unwrap(),
        "mine"
    );
    // A refused init cleaned up after itself (the links it met were removed, never followed).
    for top in entries(root.path()) {
        assert!(!is_init_temp(&top), "left behind: {top}");
        for e in entries(&root.path().join(&top)) {
            assert!(!is_init_temp(&e), "left behind: {top}/{e}");
        }
    }
}

/// The sizes that make a write of `init` fail at each of its files in turn (the limit is per
/// file: the first file larger than it fails).
const FILE_SIZE_LIMITS: [u64; 5] = [1, 200, 700, 800, 1600];

/// `init DIR` with RLIMIT_FSIZE at `limit` bytes (through `prlimit`), and SIGXFSZ at its
/// default (the process is killed by the first write past the limit) or ignored (the write
/// fails with EFBIG).
fn init_with_fsize(root: &Path, dir: &str, limit: u64, ignore_sigxfsz: bool) -> Output {
    let trap = if ignore_sigxfsz { "trap '' XFSZ; " } else { "" };
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{trap}exec prlimit --fsize={limit} \"$0\" init \"$1\"",
        ))
        .arg(env!("CARGO_BIN_EXE_prx-hooks"))
        .arg(dir)
        .current_dir(root)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

#[test]
fn init_killed_by_a_file_size_limit_leaves_no_partial_workspace_and_the_next_init_cleans_up() {
    use std::os::unix::process::ExitStatusExt;
    let root = tempfile::tempdir().unwrap();
    let mut killed = 0;
    for (i, limit) in FILE_SIZE_LIMITS.into_iter().enumerate() {
        for existing in [false, true] {
            let name = format!("ws-{i}-{existing}");
            let ws = root.path().join(&name);
            if existing {
                std::fs::create_dir(&ws).unwrap();
                std::fs::write(ws.join("notes.txt"), "mine").unwrap();
            }
            let out = init_with_fsize(root.path(), &name, limit, false);
            let sig = out.status.signal();
            assert!(
                sig == Some(nix::libc::SIGXFSZ),
                "init under --fsize={limit} was to be killed by SIGXFSZ: {:?}: {}",
                out.status,
                text(&out.stderr)
            );
            killed += 1;
            // Nothing of the workspace, at most init's temporary directory.
            let mine: Vec<String> = if existing {
                entries(&ws)
                    .into_iter()
                    .filter(|e| e != "notes.txt")
                    .collect()
            } else {
                assert!(
                    !ws.exists(),
                    "--fsize={limit}: {name} exists: {:?}",
                    entries(&ws)
                );
                entries(root.path())
                    .into_iter()
                    .filter(|e| e.starts_with('.'))
                    .collect()
            };
            assert!(
                mine.iter().all(|e| is_init_temp(e)) && mine.len() <= 1,
                "--fsize={limit}, {}: a partial workspace: {mine:?}",
                if existing { "existing" } else { "missing" }
            );
            // The next init (no limit) makes the whole workspace and cleans what was left.
            let out = prx(&["init", &name], root.path());
            assert!(out.status.success(), "{}", text(&out.stderr));
            let mut want = vec![
                ".gitignore",
                "README.md",
                "events.ndjson",
                "hooks",
                "hooks.json",
            ];
            if existing {
                want.push("notes.txt");
                want.sort();
            }
            assert_eq!(entries(&ws), want, "--fsize={limit}");
            assert_eq!(entries(&ws.join("hooks")), ["log-event.sh", "notify.sh"]);
            let left: Vec<String> = entries(root.path())
                .into_iter()
                .filter(|e| is_init_temp(e))
                .collect();
            assert!(left.is_empty(), "not cleaned: {left:?}");
            let out = prx(&["validate", "--strict", "--workspace", &name], root.path());
            assert!(out.status.success(), "{}", text(&out.stdout));
        }
    }
    assert_eq!(killed, 2 * FILE_SIZE_LIMITS.len());
}

#[test]
fn init_whose_write_fails_with_efbig_leaves_nothing_at_all() {
    let root = tempfile::tempdir().unwrap();
    for (i, limit) in FILE_SIZE_LIMITS.into_iter().enumerate() {
        for existing in [false, true] {
            let name = format!("ws-{i}-{existing}");
            let ws = root.path().join(&name);
            if existing {
                std::fs::create_dir(&ws).unwrap();
            }
            let out = init_with_fsize(root.path(), &name, limit, true);
            assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
            let err = text(&out.stderr);
            assert!(
                err.contains("File too large") && err.contains("nothing was left behind"),
                "{err}"
            );
            assert_eq!(ws.exists(), existing);
            assert!(entries(&ws).is_empty(), "{:?}", entries(&ws));
            assert!(
                entries(root.path()).iter().all(|e| !is_init_temp(e)),
                "{:?}",
                entries(root.path())
            );
        }
    }
}

/// `init DIR` under strace, killed with SIGKILL on entering its `when`-th rename.
fn init_killed_at_rename(root: &Path, dir: &str, when: u32) -> Output {
    Command::new("strace")
        .args(["-qq", "-o", "/dev/null", "-e", "trace=renameat2", "-e"])
        .arg(format!("inject=renameat2:signal=SIGKILL:when={when}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_prx-hooks"))
        .args(["init", dir])
        .current_dir(root)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

#[test]
fn init_killed_at_any_rename_leaves_nothing_or_what_the_next_init_completes() {
    use std::os::unix::process::ExitStatusExt;
    assert!(
        Command::new("strace").arg("-V").output().is_ok(),
        "strace is needed (apt-get install strace)"
    );
    // The order init puts the entries of an existing directory in place: hooks.json, which
    // makes it a workspace, last.
    let order = [
        ".gitignore",
        "README.md",
        "events.ndjson",
        "hooks",
        "hooks.json",
    ];
    let root = tempfile::tempdir().unwrap();
    let mut partial = 0;
    // A missing target: one rename (the staged directory into place); an existing one: one
    // per entry. One more: not killed at all.
    for (existing, renames) in [(false, 1), (true, order.len() as u32)] {
        for when in 1..=renames + 1 {
            let name = format!("ws-{existing}-{when}");
            let ws = root.path().join(&name);
            if existing {
                std::fs::create_dir(&ws).unwrap();
                std::fs::write(ws.join("notes.txt"), "mine").unwrap();
            }
            let out = init_killed_at_rename(root.path(), &name, when);
            let killed = out.status.signal() == Some(nix::libc::SIGKILL);
            assert_eq!(
                killed,
                when <= renames,
                "init {name}, killed at rename {when}: {:?}: {}",
                out.status,
                text(&out.stderr)
            );
            let temps_in = |d: &Path| -> Vec<String> {
                entries(d).into_iter().filter(|e| is_init_temp(e)).collect()
            };
            let mut temps = temps_in(root.path());
            let placed: Vec<String> = if existing {
                temps.extend(temps_in(&ws));
                entries(&ws)
                    .into_iter()
                    .filter(|e| e != "notes.txt" && !is_init_temp(e))
                    .collect()
            } else {
                entries(&ws)
            };
            assert!(temps.len() <= 1, "rename {when}: {temps:?}");
            let mut placed_in_order = placed.clone();
            placed_in_order.sort_by_key(|e| order.iter().position(|o| o == e));
            let k = placed.len();
            if !existing || !killed {
                assert!(
                    k == 0 || k == order.len(),
                    "init {name}, killed at rename {when}: a partial workspace {placed:?}"
                );
            } else {
                // Between the moves into an existing directory: the entries moved so far, in
                // order (never hooks.json before the rest), and the complete staging directory
                // the next init finishes.
                assert_eq!(placed_in_order, order[..k], "rename {when}");
                if k > 0 {
                    assert_eq!(temps.len(), 1, "rename {when}: the staging is kept");
                    partial += 1;
                }
            }
            if !killed {
                assert!(temps.is_empty(), "{temps:?}");
                continue;
            }
            let out = prx(&["init", &name], root.path());
            assert!(out.status.success(), "{}", text(&out.stderr));
            let said = text(&out.stderr);
            // Killed among the moves, the staging was complete: finished, not made again.
            assert_eq!(
                said.contains("completed the workspace"),
                existing,
                "rename {when}: {said}"
            );
            assert_eq!(
                said.contains("removed") && said.contains(".prx-hooks-init-"),
                !existing,
                "rename {when}: {said}"
            );
            let mut want: Vec<&str> = order.to_vec();
            if existing {
                want.push("notes.txt");
            }
            want.sort();
            assert_eq!(entries(&ws), want, "rename {when}: {said}");
            assert_eq!(entries(&ws.join("hooks")), ["log-event.sh", "notify.sh"]);
            assert!(temps_in(root.path()).is_empty() && temps_in(&ws).is_empty());
            let out = prx(&["validate", "--strict", "--workspace", &name], root.path());
            assert!(out.status.success(), "{}", text(&out.stdout));
        }
    }
    assert_eq!(
        partial,
        order.len() - 1,
        "every move between two renames was tried"
    );
}
