//! Command policies (docs/policies.md § Command policies) with real guard processes through
//! `Hooks::decide`: exit 2 denies with stderr as the reason, a JSON decision on stdout in an
//! agent's format answers, and a guard that sleeps past its deadline, floods stdout, crashes
//! or answers something other than JSON gives its `on_error` (never allow), counted per
//! policy; rules come first and a rule's deny answers without running a guard.

use crate::procs::alive;
use prx_hooks::Hooks;
use prx_hooks::policy::{self, CommandCount, Decision, DecisionPoint, OnError, Verdict};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

/// A guard written for Claude Code's command hooks: it reads `tool_name` and `tool_input`
/// from stdin and denies `rm -rf` by exit 2, the reason on stderr.
const NO_RM_RF: &str = r#"#!/bin/sh
input=$(cat)
case "$input" in
  *'"tool_name":"Bash"'*'rm -rf'*|*'rm -rf'*'"tool_name":"Bash"'*)
    echo "guard: rm -rf is not allowed" >&2; exit 2 ;;
esac
exit 0
"#;

/// A guard answering Claude Code's PreToolUse JSON: ask for anything touching .env.
const ASK_ENV: &str = r#"#!/bin/sh
input=$(cat)
case "$input" in
  *.env*) printf '%s' '{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "ask", "permissionDecisionReason": "touches .env"}}' ;;
esac
exit 0
"#;

fn script(ws: &Path, name: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let p = ws.join(name);
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn hooks_with(ws: &Path, policies: serde_json::Value) -> Hooks {
    std::fs::write(ws.join("policies.json"), policies.to_string()).unwrap();
    let hooks = Hooks::builder().workspace(ws).build().unwrap();
    let t = hooks.policy_table();
    assert!(
        t.source.is_some() && !t.commands.is_empty(),
        "policies.json did not load: {:?}",
        hooks.stats().policies().and_then(|p| p.file.clone())
    );
    hooks
}

fn bash(hooks: &Hooks, command: &str) -> Verdict {
    let payload = json!({"tool": "Bash", "arguments": {"command": command}}).to_string();
    hooks
        .decide(DecisionPoint::ToolCallStart, "claude-code", &payload)
        .unwrap()
}

fn counts(hooks: &Hooks, id: &str) -> CommandCount {
    let s = hooks.stats();
    let p = s.policies().unwrap();
    p.commands
        .iter()
        .find(|c| c.policy == id)
        .unwrap_or_else(|| panic!("no counts for {id}: {:?}", p.commands))
        .clone()
}

#[test]
fn a_guard_script_denies_by_exit_2_with_its_stderr_as_the_reason() {
    let ws = tempfile::tempdir().unwrap();
    script(ws.path(), "no-rm-rf.sh", NO_RM_RF);
    let hooks = hooks_with(
        ws.path(),
        json!({"policies": [{"id": "guard", "on": ["tool_call_start"], "matcher": "Bash",
            "command": "./no-rm-rf.sh", "timeout_ms": 10000}]}),
    );
    let v = bash(&hooks, "rm -rf /tmp/victim");
    assert_eq!(v.decision, Some(Decision::Deny));
    assert_eq!(v.reason.as_deref(), Some("guard: rm -rf is not allowed"));
    assert_eq!(v.policy.as_deref(), Some("guard"));
    let v = bash(&hooks, "ls");
    assert_eq!(v.decision, None, "exit 0 without output decides nothing");
    // A tool the matcher does not name never starts the guard.
    let v = hooks
        .decide(
            DecisionPoint::ToolCallStart,
            "claude-code",
            r#"{"tool": "Read", "arguments": {"command": "rm -rf /"}}"#,
        )
        .unwrap();
    assert_eq!(v.decision, None);
    let c = counts(&hooks, "guard");
    assert_eq!((c.runs, c.deny, c.none, c.decisions), (2, 1, 1, 1));
    let p = hooks.stats().policies().cloned().unwrap();
    assert_eq!((p.deny, p.none), (1, 2));
    hooks.shutdown(Duration::from_secs(2));
}

#[test]
fn a_json_answer_on_stdout_decides_and_the_most_restrictive_source_wins() {
    let ws = tempfile::tempdir().unwrap();
    script(ws.path(), "ask-env.sh", ASK_ENV);
    script(ws.path(), "no-rm-rf.sh", NO_RM_RF);
    let marker = ws.path().join("guard-ran");
    script(
        ws.path(),
        "mark.sh",
        &format!("#!/bin/sh\ntouch {}\nexit 0\n", marker.display()),
    );
    let hooks = hooks_with(
        ws.path(),
        json!({"policies": [
            {"id": "ask-env", "on": ["tool_call_start"], "command": "./ask-env.sh", "timeout_ms": 10000},
            {"id": "allow-cat", "on": ["tool_call_start"], "matcher": "Bash",
             "when": {"arguments.command": {"prefix": "cat"}}, "decision": "allow"},
            {"id": "guard", "on": ["tool_call_start"], "command": "./no-rm-rf.sh", "timeout_ms": 10000},
            {"id": "rule-deny", "on": ["tool_call_start"],
             "when": {"arguments.command": {"prefix": "shutdown"}}, "decision": "deny", "reason": "no"},
            {"id": "mark", "on": ["tool_call_start"], "command": "./mark.sh", "timeout_ms": 10000}
        ]}),
    );
    // The rule allows, the guard asks: ask wins, reported with the guard's reason.
    let v = bash(&hooks, "cat .env");
    assert_eq!(
        (v.decision, v.policy.as_deref(), v.reason.as_deref()),
        (Some(Decision::Ask), Some("ask-env"), Some("touches .env"))
    );
    // The rule alone allows: the guards decided nothing.
    let v = bash(&hooks, "cat README");
    assert_eq!(
        (v.decision, v.policy.as_deref()),
        (Some(Decision::Allow), Some("allow-cat"))
    );
    // Two sources deny: the first in file order is reported (the guard, before the rule
    // would be; here the rule does not match, the exit-2 guard denies).
    let v = bash(&hooks, "cat .env; rm -rf /");
    assert_eq!(
        (v.decision, v.policy.as_deref()),
        (Some(Decision::Deny), Some("guard"))
    );
    std::fs::remove_file(&marker).unwrap();
    // A rule's deny answers at once: no guard is started.
    let v = bash(&hooks, "shutdown now");
    assert_eq!(
        (v.decision, v.policy.as_deref()),
        (Some(Decision::Deny), Some("rule-deny"))
    );
    assert!(!marker.exists(), "a guard ran after a rule denied");
    assert_eq!(counts(&hooks, "ask-env").runs, 3);
    assert_eq!(counts(&hooks, "ask-env").decisions, 1);
    hooks.shutdown(Duration::from_secs(2));
}

#[test]
fn a_guard_sleeping_past_its_deadline_is_killed_with_its_children_and_gives_on_error() {
    let ws = tempfile::tempdir().unwrap();
    let pids = ws.path().join("pids");
    script(
        ws.path(),
        "slow.sh",
        &format!(
            "#!/bin/sh\nsleep 60 &\necho $! >> {p}\necho $$ >> {p}\nsleep 60\n",
            p = pids.display()
        ),
    );
    let hooks = hooks_with(
        ws.path(),
        json!({"policies": [
            {"id": "slow-none", "on": ["tool_call_start"], "command": "./slow.sh", "timeout_ms": 300},
            {"id": "slow-deny", "on": ["permission"], "command": "./slow.sh", "timeout_ms": 300,
             "on_error": "deny"}
        ]}),
    );
    let start = Instant::now();
    let v = bash(&hooks, "ls");
    assert_eq!(v.decision, None, "on_error none: no decision, never allow");
    // Liveness, with generous slack: the guard sleeps 60 s.
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    let v = hooks
        .decide(
            DecisionPoint::Permission,
            "claude-code",
            r#"{"tool": "Bash", "arguments": {"command": "ls"}}"#,
        )
        .unwrap();
    assert_eq!(v.decision, Some(Decision::Deny));
    assert_eq!(v.policy.as_deref(), Some("slow-deny"));
    let reason = v.reason.unwrap();
    assert!(reason.contains("timed out after 300 ms"), "{reason}");
    // The guard and the child it left are gone (killed, reaped or reparented and reaped).
    let started: Vec<i32> = std::fs::read_to_string(&pids)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(started.len(), 4, "two runs, two processes each");
    let until = Instant::now() + Duration::from_secs(10);
    while started.iter().any(|&p| alive(p)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<i32> = started.iter().copied().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "still running: {left:?}");
    let (a, b) = (counts(&hooks, "slow-none"), counts(&hooks, "slow-deny"));
    assert_eq!((a.runs, a.timed_out, a.on_error_deny), (1, 1, 0));
    assert_eq!(
        (b.runs, b.timed_out, b.on_error_deny, b.decisions),
        (1, 1, 1, 1)
    );
    hooks.shutdown(Duration::from_secs(2));
}

#[test]
fn flooding_stdout_crashing_or_answering_non_json_gives_on_error() {
    let ws = tempfile::tempdir().unwrap();
    script(
        ws.path(),
        "flood.sh",
        "#!/bin/sh\ncat >/dev/null\nexec yes deny\n",
    );
    script(
        ws.path(),
        "crash.sh",
        "#!/bin/sh\ncat >/dev/null\necho 'guard: lost my config' >&2\nkill -SEGV $$\n",
    );
    script(
        ws.path(),
        "exit1.sh",
        "#!/bin/sh\necho 'oops' >&2\nexit 1\n",
    );
    script(
        ws.path(),
        "prose.sh",
        "#!/bin/sh\necho 'I would deny this'\n",
    );
    let policies = |on_error: &str| {
        json!({"policies": [
            {"id": "flood", "on": ["tool_call_start"], "matcher": "flood", "command": "./flood.sh",
             "timeout_ms": 10000, "on_error": on_error},
            {"id": "crash", "on": ["tool_call_start"], "matcher": "crash", "command": "./crash.sh",
             "timeout_ms": 10000, "on_error": on_error},
            {"id": "exit1", "on": ["tool_call_start"], "matcher": "exit1", "command": "./exit1.sh",
             "timeout_ms": 10000, "on_error": on_error},
            {"id": "prose", "on": ["tool_call_start"], "matcher": "prose", "command": "./prose.sh",
             "timeout_ms": 10000, "on_error": on_error}
        ]})
    };
    let ask = |hooks: &Hooks, tool: &str| {
        let payload = json!({"tool": tool, "arguments": {}}).to_string();
        hooks
            .decide(DecisionPoint::ToolCallStart, "a", &payload)
            .unwrap()
    };
    let hooks = hooks_with(ws.path(), policies("none"));
    assert_eq!(
        hooks.policy_table().commands[0].on_error,
        OnError::None,
        "as written"
    );
    for tool in ["flood", "crash", "exit1", "prose"] {
        let start = Instant::now();
        let v = ask(&hooks, tool);
        assert_eq!(v.decision, None, "{tool}: on_error none decides nothing");
        assert!(
            start.elapsed() < Duration::from_secs(9),
            "{tool}: waited to the deadline"
        );
    }
    let c = |id| counts(&hooks, id);
    assert_eq!((c("flood").runs, c("flood").too_large), (1, 1));
    assert_eq!((c("crash").runs, c("crash").crashed), (1, 1));
    assert_eq!((c("exit1").runs, c("exit1").crashed), (1, 1));
    assert_eq!((c("prose").runs, c("prose").bad_answer), (1, 1));
    hooks.shutdown(Duration::from_secs(2));

    let hooks = hooks_with(ws.path(), policies("deny"));
    let reasons: Vec<String> = ["flood", "crash", "exit1", "prose"]
        .into_iter()
        .map(|tool| {
            let v = ask(&hooks, tool);
            assert_eq!(v.decision, Some(Decision::Deny), "{tool}");
            assert_eq!(v.policy.as_deref(), Some(tool));
            v.reason.unwrap()
        })
        .collect();
    assert!(
        reasons[0].contains("more than 65536 bytes on stdout"),
        "{}",
        reasons[0]
    );
    assert!(
        reasons[1].contains("killed by signal 11") && reasons[1].contains("lost my config"),
        "{}",
        reasons[1]
    );
    assert!(
        reasons[2].contains("exited with code 1 (oops)"),
        "{}",
        reasons[2]
    );
    assert!(reasons[3].contains("not JSON"), "{}", reasons[3]);
    assert_eq!(counts(&hooks, "flood").on_error_deny, 1);
    hooks.shutdown(Duration::from_secs(2));
}

#[test]
fn command_policy_errors_name_file_line_column_and_field() {
    let ws = tempfile::tempdir().unwrap();
    script(ws.path(), "ok.sh", "#!/bin/sh\nexit 0\n");
    std::fs::write(ws.path().join("plain.txt"), "not a program").unwrap();
    let text = r#"{"timeout_ms": 0, "policies": [
  {"id": "a", "on": ["tool_call_start"], "command": "./ok.sh", "decision": "deny"},
  {"id": "b", "on": ["tool_call_start"], "command": "./ok.sh", "timeout_ms": 999999},
  {"id": "c", "on": ["tool_call_start"], "command": "./ok.sh", "on_error": "allow"},
  {"id": "d", "on": ["tool_call_start"], "decision": "deny", "args": ["x"]},
  {"id": "e", "on": ["tool_call_start"], "command": "./missing.sh"},
  {"id": "f", "on": ["tool_call_start"], "command": "./plain.txt"},
  {"id": "g", "on": ["tool_call_start"], "command": "python3 guard.py"},
  {"id": "h", "on": ["tool_call_start"], "command": "./ok.sh", "args": [1]},
  {"id": "i", "on": ["tool_call_start"], "command": "../escape.sh"}
]}"#;
    std::fs::write(ws.path().join("policies.json"), text).unwrap();
    let errs = policy::load(ws.path()).unwrap_err().to_string();
    let label = format!("{}:", ws.path().join("policies.json").display());
    let want = [
        "1:16: timeout_ms: 0 is out of range: expected a whole number of milliseconds, 1 to 30000",
        "2:64: policies[0].decision: a command policy has no \"decision\"",
        "3:78: policies[1].timeout_ms: 999999 is out of range",
        "4:76: policies[2].on_error: \"allow\" is not a failure mode: expected \"none\"",
        "5:62: policies[3].args: only a command policy (one with \"command\") has \"args\"",
        "6:53: policies[4].command: ",
        "7:53: policies[5].command: ",
        "8:53: policies[6].command: \"python3 guard.py\" contains whitespace",
        "9:73: policies[7].args[0]: expected a string, found number",
        "10:53: policies[8].command: \"../escape.sh\" leads out of the workspace",
    ];
    for w in want {
        assert!(
            errs.lines()
                .any(|l| l.strip_prefix(&label).is_some_and(|l| l.starts_with(w))),
            "missing {w:?} in:\n{errs}"
        );
    }
    let ws_shown = ws.path().display();
    assert!(
        errs.contains(&format!("{ws_shown}/missing.sh: No such file")),
        "{errs}"
    );
    // Every problem at once, one a line.
    assert_eq!(errs.lines().count(), 10, "{errs}");
    assert!(errs.contains("plain.txt is not executable"), "{errs}");
}
