//! Leak checks for shell hooks: zombies, file descriptors, payload files (ARCHITECTURE.md § Testing).
//!
//! A dedicated test binary with ONE test that runs every case in sequence, so nothing else in
//! the process spawns, opens or reaps while it counts. It points `TMPDIR` at a fresh directory
//! before any sink (or any other thread of ours) exists: the sinks take their payload directory
//! from `TMPDIR`, so "no temp file left" is checked on the default path. No subreaper here:
//! every timing-out hook `exec`s its sleeper, so the killed process is the leader we reap
//! ourselves and nothing is orphaned.

use prx_hooks::config::{Action, HookTable};
use prx_hooks::shell::{OutcomeKind, ShellLimits, ShellSink, event_message};
use prx_hooks::{Event, EventKind, Message, Sink};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The one place this file builds an `Action` (the model may grow fields).
fn action(id: &str, event: EventKind, script: &str, cwd: &Path) -> Action {
    Action {
        id: id.into(),
        id_explicit: true,
        event,
        index: 0,
        command: "/bin/sh".into(),
        program: Ok("/bin/sh".into()),
        args: vec!["-c".into(), script.into()],
        env: Vec::new(),
        cwd: cwd.to_path_buf(),
        timeout: Duration::from_millis(100),
        timeout_explicit: true,
        stdin_json: false,
        enabled: true,
        matcher: None,
        max_concurrent: 16,
        limits: Default::default(),
    }
}

fn table(actions: Vec<Action>) -> Arc<HookTable> {
    Arc::new(HookTable {
        enabled: true,
        env_passthrough: Vec::new(),
        actions: actions.into_iter().map(Arc::new).collect(),
        source: None,
        warnings: Vec::new(),
        path: None,
    })
}

fn turn(seq: u64) -> Message {
    event_message(&Event::TurnComplete, "agent", "session", seq)
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Our children, as (pid, state).
fn children() -> Vec<(i32, char)> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|p| {
            let s = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let rest = &s[s.rfind(')')? + 2..];
            let mut f = rest.split_whitespace();
            let state = f.next()?.chars().next()?;
            let ppid: i32 = f.next()?.parse().ok()?;
            (ppid == me).then_some((p, state))
        })
        .collect()
}

fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn settle(sink: &ShellSink) -> prx_hooks::shell::ShellStats {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let st = sink.stats();
        assert!(st.totals.balanced(), "{:?}", st.totals);
        if st.totals.running + st.totals.queued + st.direct_running == 0 {
            return st;
        }
        assert!(Instant::now() < until, "did not settle: {:?}", st.totals);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Checks that nothing of ours is left: no child (zombie or not), the same fds, no files.
fn assert_clean(case: &str, fds: usize, tmp: &Path) {
    // Threads are joined and children reaped before `shutdown` returns; allow a moment for
    // /proc to catch up with the last exits.
    let until = Instant::now() + Duration::from_secs(2);
    while !children().is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let kids = children();
    let zombies: Vec<_> = kids.iter().filter(|(_, s)| *s == 'Z').collect();
    assert!(zombies.is_empty(), "{case}: zombies {zombies:?}");
    assert!(kids.is_empty(), "{case}: children left {kids:?}");
    assert_eq!(fd_count(), fds, "{case}: fd count changed");
    let left = files_in(tmp);
    assert!(left.is_empty(), "{case}: files left in TMPDIR: {left:?}");
}

#[test]
fn no_zombies_no_fds_no_temp_files() {
    // Before any thread of ours exists (the harness's own thread only waits for this test).
    let tmp = tempfile::tempdir().unwrap();
    // SAFETY: the only test of this binary; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("TMPDIR", tmp.path()) };
    let tmp = tmp.path();
    let ws = tempfile::Builder::new().tempdir_in(tmp).unwrap();
    let ws_path = ws.path().to_path_buf();
    // The workspace lives in TMPDIR too; only payload files may not.
    let tmp_files = |d: &Path| -> Vec<String> {
        files_in(d)
            .into_iter()
            .filter(|f| f.starts_with("prx-hooks-"))
            .collect()
    };
    let fds = fd_count();

    // 1. 2,000 runs through the queue: 10 % time out, 10 % exit 2 with stderr, 80 % ok.
    {
        let a = action(
            "mixed",
            EventKind::TurnComplete,
            "case $ZERO_HOOK_SEQ in *0) exec sleep 30;; *5) echo oops >&2; exit 2;; esac",
            &ws_path,
        );
        let sink = ShellSink::standalone(ws_path.clone(), ShellLimits::default());
        assert_eq!(sink.tmp_dir(), tmp);
        sink.set_table(table(vec![a]));
        for seq in 0..2000u64 {
            // Pace on the queue: this case is about leaks, not drops.
            while sink.stats().totals.queued >= 200 {
                std::thread::sleep(Duration::from_millis(1));
            }
            sink.deliver(&turn(seq));
        }
        let st = settle(&sink);
        let c = st.hooks["mixed"];
        assert_eq!(
            (c.sent, c.ok, c.exit, c.timed_out, c.dropped, c.spawn_failed),
            (2000, 1600, 200, 200, 0, 0),
            "{c:?}"
        );
        assert_eq!(st.totals, c);
        let counts = sink.counts();
        assert_eq!(
            (
                counts.sent,
                counts.delivered,
                counts.failed,
                counts.in_flight
            ),
            (2000, 1600, 400, 0)
        );
        assert!(sink.runs("mixed").iter().any(|o| o.stderr_tail == "oops\n"));
        sink.shutdown(Instant::now() + Duration::from_secs(5));
        drop(sink);
        assert_eq!(tmp_files(tmp), Vec::<String>::new());
        assert_clean("2,000 runs", fds, &ws_path);
    }

    // 2. stdin payloads (256 KiB) to readers, partial readers and non-readers; stderr floods.
    {
        let mut hooks = vec![
            action(
                "partial",
                EventKind::ToolCall,
                "head -c 10 >/dev/null",
                &ws_path,
            ),
            action("none", EventKind::ToolCall, "exit 0", &ws_path),
            action("all", EventKind::ToolCall, "cat >/dev/null", &ws_path),
            action(
                "noisy",
                EventKind::ToolCall,
                "head -c 100000 /dev/zero | tr '\\0' x >&2; exit 1",
                &ws_path,
            ),
            action("stuck", EventKind::ToolCall, "exec sleep 30", &ws_path),
        ];
        for h in &mut hooks {
            h.stdin_json = true;
            h.timeout = Duration::from_secs(10);
        }
        hooks[4].timeout = Duration::from_millis(50);
        let sink = ShellSink::standalone(ws_path.clone(), ShellLimits::default());
        sink.set_table(table(hooks));
        let out = "z".repeat(256 << 10);
        for seq in 0..40u64 {
            while sink.stats().totals.queued >= 100 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let msg = event_message(
                &Event::ToolCall {
                    tool: "t",
                    success: true,
                    output: &out,
                },
                "agent",
                "session",
                seq,
            );
            sink.deliver(&msg);
        }
        let st = settle(&sink);
        for id in ["partial", "none", "all"] {
            assert_eq!(st.hooks[id].ok, 40, "{id}: {:?}", sink.runs(id).last());
        }
        assert_eq!(st.hooks["noisy"].exit, 40);
        assert_eq!(st.hooks["stuck"].timed_out, 40);
        let tail = &sink.runs("noisy")[0].stderr_tail;
        assert_eq!(tail.len(), prx_hooks::shell::STDERR_TAIL);
        sink.shutdown(Instant::now() + Duration::from_secs(5));
        drop(sink);
        assert_eq!(tmp_files(tmp), Vec::<String>::new());
        assert_clean("stdin/stderr", fds, &ws_path);
    }

    // 3. run_once, 100 times, every third timing out.
    {
        let sink = ShellSink::standalone(ws_path.clone(), ShellLimits::default());
        let ok = action("ok", EventKind::TurnComplete, "exit 0", &ws_path);
        let slow = action("slow", EventKind::TurnComplete, "exec sleep 30", &ws_path);
        for i in 0..100u64 {
            let a = if i % 3 == 0 { &slow } else { &ok };
            let o = sink.run_once(a, &turn(i));
            let want = if i % 3 == 0 {
                OutcomeKind::TimedOut { after_ms: 100 }
            } else {
                OutcomeKind::Ok
            };
            assert_eq!(o.kind, want, "{o}");
        }
        assert_eq!(sink.stats().direct_running, 0);
        drop(sink);
        assert_eq!(tmp_files(tmp), Vec::<String>::new());
        assert_clean("run_once", fds, &ws_path);
    }

    // 4. Shutdown with work in flight: 16 running, 50 queued, all killed or cancelled.
    {
        let mut a = action("long", EventKind::TurnComplete, "exec sleep 30", &ws_path);
        a.timeout = Duration::from_secs(60);
        let sink = ShellSink::standalone(ws_path.clone(), ShellLimits::default());
        sink.set_table(table(vec![a]));
        for seq in 0..66 {
            sink.deliver(&turn(seq));
        }
        let until = Instant::now() + Duration::from_secs(10);
        while sink.stats().totals.running < 16 {
            assert!(Instant::now() < until);
            std::thread::sleep(Duration::from_millis(5));
        }
        sink.shutdown(Instant::now() + Duration::from_millis(100));
        let c = sink.stats().totals;
        assert!(c.balanced());
        assert_eq!(
            (c.sent, c.killed, c.cancelled, c.running, c.queued),
            (66, 16, 50, 0, 0),
            "{c:?}"
        );
        drop(sink);
        assert_eq!(tmp_files(tmp), Vec::<String>::new());
        assert_clean("shutdown", fds, &ws_path);
    }

    // 5. A sink dropped without an explicit shutdown cleans up after itself too.
    {
        let a = action("drop", EventKind::TurnComplete, "exec sleep 30", &ws_path);
        let sink = ShellSink::standalone(ws_path.clone(), ShellLimits::default());
        sink.set_table(table(vec![a]));
        sink.deliver(&turn(0));
        drop(sink);
        assert_eq!(tmp_files(tmp), Vec::<String>::new());
        assert_clean("drop", fds, &ws_path);
    }
    drop(ws);
}
