//! `prx-hooks connect` cannot hurt a settings file (docs/connect.md § How the file is changed):
//! a link's target is never deleted, a user's command that merely starts like ours is left
//! alone, a user's comment survives `--remove`, a FIFO is refused at once, `--remove` takes out
//! any number of entries in one pass, an empty `$CODEX_HOME` is `~/.codex`, and an agent's
//! save made while `connect` runs is never lost. Each runs the real binary on real files.

use serde_json::Value;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// A project, a workspace and a home in one temporary directory.
struct Setup {
    _root: tempfile::TempDir,
    project: PathBuf,
    ws: PathBuf,
    home: PathBuf,
}

fn setup() -> Setup {
    let root = tempfile::tempdir().unwrap();
    let project = root.path().join("project");
    let ws = project.join("ws");
    let home = root.path().join("home");
    for d in [&project, &ws, &home] {
        std::fs::create_dir_all(d).unwrap();
    }
    Setup {
        project: project.canonicalize().unwrap(),
        ws: ws.canonicalize().unwrap(),
        home,
        _root: root,
    }
}

/// The directory of the binaries under test, first on `PATH` (as after `cargo install`).
fn path_with_bins() -> String {
    let bins = Path::new(BIN)
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    format!("{bins}:/usr/bin:/bin")
}

impl Setup {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .current_dir(&self.project)
            .env("HOME", &self.home)
            .env("PATH", path_with_bins())
            .env_remove("CODEX_HOME")
            .env_remove("PRX_HOOKS_TOKEN");
        c
    }

    /// `prx-hooks ARGS --workspace WS` (not with `--remove`).
    fn run(&self, args: &[&str]) -> Output {
        let mut all = args.to_vec();
        let ws = self.ws.to_str().unwrap();
        if !args.contains(&"--remove") {
            all.extend(["--workspace", ws]);
        }
        self.command(&all).output().unwrap()
    }
}

/// `child` waited for at most `limit`; killed and `None` past it.
fn wait_at_most(mut child: std::process::Child, limit: Duration) -> Option<Output> {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The text with `//` line comments taken out (what Gemini CLI reads, for these files).
fn without_line_comments(text: &str) -> String {
    text.lines()
        .map(|l| match l.find(" //") {
            Some(at) => &l[..at],
            None => l,
        })
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn connect_remove_through_a_link_keeps_the_linked_file_and_names_the_backup_where_it_is() {
    let s = setup();
    let real = s.home.join("dotfiles/claude.json");
    std::fs::create_dir_all(real.parent().unwrap()).unwrap();
    std::fs::write(&real, "{}\n").unwrap();
    let link = s.project.join(".claude/settings.json");
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    ok(&s.run(&["connect", "claude-code", "--events", "Stop"]));
    let connected = std::fs::read_to_string(&real).unwrap();
    assert!(connected.contains("prx-hooks"), "{connected}");

    let out = s.run(&["connect", "claude-code", "--remove"]);
    ok(&out);
    // The dotfiles file is the user's: it stays, emptied of ours; the link stays a link.
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read_to_string(&real).ok().as_deref(),
        Some("{}\n"),
        "the link's target was deleted: {}",
        text(&out.stdout)
    );
    // The backup named on stdout is where it says, and holds the connected text.
    let said = text(&out.stdout);
    let backup = said
        .split("(before: ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or_else(|| panic!("no backup named: {said}"));
    assert_eq!(
        std::fs::read_to_string(backup).ok().as_deref(),
        Some(connected.as_str()),
        "the backup is not at {backup}"
    );
}

#[test]
fn connect_leaves_a_users_compound_command_that_starts_like_ours() {
    let s = setup();
    let file = s.project.join(".claude/settings.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let mine = "{\n  \"hooks\": {\n    \"Stop\": [\n      {\"hooks\": [{\"type\": \"command\", \"command\": \"prx-hooks send --from claude-code --workspace /x && notify-send 'done'\"}]}\n    ]\n  }\n}\n";
    std::fs::write(&file, mine).unwrap();
    ok(&s.run(&["connect", "claude-code", "--events", "Stop"]));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let groups = v["hooks"]["Stop"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{v}");
    assert_eq!(
        groups[0]["hooks"][0]["command"],
        "prx-hooks send --from claude-code --workspace /x && notify-send 'done'"
    );
    let out = s.run(&["connect", "claude-code", "--remove"]);
    ok(&out);
    assert_eq!(
        std::fs::read_to_string(&file).ok().as_deref(),
        Some(mine),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn connect_remove_keeps_a_comment_after_the_comma_of_the_users_group() {
    let s = setup();
    let file = s.project.join(".gemini/settings.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let mine = "{\n  \"hooks\": {\n    \"BeforeTool\": [\n      {\"matcher\": \"write_file\", \"hooks\": [{\"type\": \"command\", \"command\": \"./scan.sh\"}]}\n    ]\n  }\n}\n";
    std::fs::write(&file, mine).unwrap();
    ok(&s.run(&["connect", "gemini-cli", "--events", "BeforeTool"]));
    // The user then notes something after the comma that now follows their group.
    let connected = std::fs::read_to_string(&file).unwrap();
    let noted = connected.replacen(
        "\"./scan.sh\"}]},",
        "\"./scan.sh\"}]}, // mine: the secret scanner",
        1,
    );
    assert_ne!(noted, connected, "{connected}");
    std::fs::write(&file, &noted).unwrap();
    ok(&s.run(&["connect", "gemini-cli", "--remove"]));
    let after = std::fs::read_to_string(&file).unwrap();
    assert!(after.contains("// mine: the secret scanner"), "{after}");
    let v: Value = serde_json::from_str(&without_line_comments(&after))
        .unwrap_or_else(|e| panic!("{e}: {after}"));
    assert_eq!(v["hooks"]["BeforeTool"].as_array().unwrap().len(), 1, "{v}");
    assert!(!after.contains("prx-hooks"), "{after}");
}

#[test]
fn connect_refuses_a_fifo_at_once_and_writes_nothing() {
    let s = setup();
    let file = s.project.join(".claude/settings.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    nix::unistd::mkfifo(&file, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let ws = s.ws.to_str().unwrap().to_string();
    let child = s
        .command(&["connect", "claude-code", "--workspace", &ws])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_at_most(child, Duration::from_secs(10)).expect("connect hangs on a FIFO");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not a regular file"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        std::fs::symlink_metadata(&file)
            .unwrap()
            .file_type()
            .is_fifo()
    );
}

#[test]
fn connect_remove_takes_out_ten_thousand_five_hundred_entries_in_one_pass() {
    let s = setup();
    let file = s.project.join(".claude/settings.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let n = 10_500;
    let mut t = String::from(
        "{\n  \"hooks\": {\n    \"Stop\": [\n      {\"hooks\": [{\"type\": \"command\", \"command\": \"notify-send done\"}]}",
    );
    for i in 0..n {
        t.push_str(&format!(
            ",\n      {{\"hooks\": [{{\"type\": \"command\", \"command\": \"prx-hooks send --from claude-code --workspace /ws{i}\"}}]}}"
        ));
    }
    t.push_str("\n    ]\n  }\n}\n");
    std::fs::write(&file, &t).unwrap();
    let child = s
        .command(&["connect", "claude-code", "--remove"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_at_most(child, Duration::from_secs(60))
        .expect("--remove of 10,500 entries took over 60 s");
    ok(&out);
    let after = std::fs::read_to_string(&file).unwrap();
    let v: Value = serde_json::from_str(&after).unwrap();
    let groups = v["hooks"]["Stop"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{} of ours left", groups.len() - 1);
    assert_eq!(groups[0]["hooks"][0]["command"], "notify-send done");
    assert!(
        text(&out.stdout).contains(&format!("took out {n} entries")),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn connect_codex_with_an_empty_codex_home_writes_under_dot_codex() {
    let s = setup();
    let ws = s.ws.to_str().unwrap().to_string();
    let out = s
        .command(&["connect", "codex", "--workspace", &ws])
        .env("CODEX_HOME", "")
        .output()
        .unwrap();
    ok(&out);
    assert!(
        !s.home.join("config.toml").exists(),
        "wrote ~/config.toml: {}",
        text(&out.stdout)
    );
    assert!(s.home.join(".codex").is_dir(), "{}", text(&out.stdout));
}

/// Saves of an agent racing `connect`: a thread that saves the settings file (by rename and
/// in place, alternately) right after someone else has read it (inotify: a close of the file
/// opened for reading), after some of those reads chosen at random, until it finds the file
/// changed by someone else; then the file must hold its last save (with or without our hooks
/// added to it). A save right after connect's last look at the file is one it must not lose.
struct Saver {
    stop: Arc<AtomicBool>,
    last: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn save(file: &Path, n: u64, in_place: bool) -> std::fs::Metadata {
    // One length for every save (an in-place save then leaves no tail of an earlier one).
    let body = format!("{{\"model\": \"opus\", \"n\": \"{n:012}\"}}\n");
    if in_place {
        use std::io::{Seek, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.write_all(body.as_bytes()).unwrap();
        f.set_len(body.len() as u64).unwrap();
    } else {
        let tmp = file.with_extension("saving");
        std::fs::write(&tmp, &body).unwrap();
        std::fs::rename(&tmp, file).unwrap();
    }
    std::fs::metadata(file).unwrap()
}

/// What tells a file apart from a later write of it, without reading it (a read would be
/// seen as someone else's).
fn identity(m: &std::fs::Metadata) -> (u64, i64, i64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.ino(), m.mtime(), m.mtime_nsec(), m.size())
}

/// An inotify descriptor watching `dir` for files closed after reading.
fn watch_reads(dir: &Path) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let dir = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: inotify_init1 takes no pointer; the descriptor it returns is owned here.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    assert!(
        fd >= 0,
        "inotify_init1: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `dir` is a NUL-terminated path that lives for the call.
    let w = unsafe { libc::inotify_add_watch(fd, dir.as_ptr(), libc::IN_CLOSE_NOWRITE) };
    assert!(
        w >= 0,
        "inotify_add_watch: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `fd` was just made and nothing else owns it.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}

/// How many reads of the file named `name` the events waiting on `fd` report (waits up to
/// 1 ms for the first).
fn reads_of(fd: &std::os::fd::OwnedFd, name: &[u8]) -> usize {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd that lives for the call.
    if unsafe { libc::poll(&mut pfd, 1, 1) } <= 0 {
        return 0;
    }
    let mut buf = [0u8; 4096];
    // SAFETY: `buf` is writable for its length.
    let got = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    let (mut at, mut reads) = (0, 0);
    let head = std::mem::size_of::<libc::inotify_event>();
    while got > 0 && at + head <= got as usize {
        // SAFETY: the kernel wrote whole events; the header is read unaligned.
        let ev: libc::inotify_event =
            unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
        let raw = &buf[at + head..at + head + ev.len as usize];
        let n = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        if &raw[..n] == name {
            reads += 1;
        }
        at += head + ev.len as usize;
    }
    reads
}

impl Saver {
    fn start(file: PathBuf, seed: u64) -> Saver {
        let stop = Arc::new(AtomicBool::new(false));
        let last = Arc::new(AtomicU64::new(0));
        let meta = save(&file, 0, false);
        let watch = watch_reads(file.parent().unwrap());
        let name = file
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .as_bytes()
            .to_vec();
        let (stop2, last2) = (stop.clone(), last.clone());
        let thread = std::thread::spawn(move || {
            // The saver shares one CPU with connect, which runs at the lowest priority: woken
            // by a read, it saves before connect takes its next step.
            // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET and sched_setaffinity get
            // a pointer to it that lives for the calls (pid 0: this thread).
            unsafe {
                let mut cpu: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut cpu);
                let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &cpu);
            }
            let mut mine = identity(&meta);
            let (mut n, mut seed) = (0, seed | 1);
            while !stop2.load(Ordering::Relaxed) {
                let reads = reads_of(&watch, &name);
                let now = std::fs::metadata(&file).map(|m| identity(&m));
                if now.ok() != Some(mine) {
                    return; // someone else wrote it: stop saving, keep the last save as it is
                }
                for _ in 0..reads {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    if (seed >> 33) % 2 == 0 {
                        n += 1;
                        mine = identity(&save(&file, n, n % 2 == 0));
                        last2.store(n, Ordering::Relaxed);
                    }
                }
            }
        });
        Saver {
            stop,
            last,
            thread: Some(thread),
        }
    }

    /// Stops it; its last save's number.
    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        self.last.load(Ordering::Relaxed)
    }
}

#[test]
fn connect_never_loses_a_save_the_agent_makes_while_it_runs() {
    let s = setup();
    let file = s.project.join(".claude/settings.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let ws = s.ws.to_str().unwrap().to_string();
    let (mut written, mut refused, mut last_refusal) = (0, 0, String::new());
    for round in 0..150 {
        let saver = Saver::start(file.clone(), round);
        let mut c = Command::new("nice");
        c.args([
            "-n",
            "19",
            "taskset",
            "-c",
            "0",
            BIN,
            "connect",
            "claude-code",
        ])
        .args(["--events", "Stop", "--workspace", &ws])
        .current_dir(&s.project)
        .env("HOME", &s.home)
        .env("PATH", path_with_bins());
        let out = c.output().unwrap();
        let last = saver.finish();
        let now = std::fs::read_to_string(&file).unwrap();
        let v: Value = serde_json::from_str(&now).unwrap_or_else(|e| panic!("{e}: {now}"));
        assert_eq!(
            v["n"].as_str().and_then(|n| n.parse::<u64>().ok()),
            Some(last),
            "round {round}: the save {last} was lost; the file holds {now}\nconnect said: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        match out.status.code() {
            Some(0) => written += 1,
            // A half-saved file (an in-place save caught midway) or a save connect saw and
            // did not overwrite: refused, nothing written.
            Some(2) => {
                refused += 1;
                last_refusal = text(&out.stderr);
            }
            other => panic!("exit {other:?}: {}", text(&out.stderr)),
        }
        let _ = std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644));
    }
    assert!(
        written > 0,
        "connect never wrote ({refused} refused; the last: {last_refusal})"
    );
}
