"""hooks.decide(...): the decision lane from Python, answered by a real policies.json."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import prx_hooks
from conftest import wait_for

# The contract file, as written, plus an ask rule and a prompt rule.
POLICIES = {
    "policies": [
        {
            "id": "no-rm-rf",
            "on": ["tool_call_start"],
            "matcher": "Bash|shell|run_shell_command|exec_command",
            "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
            "decision": "deny",
            "reason": "rm -rf is not allowed in this workspace",
        },
        {
            "id": "ask-push",
            "on": ["tool_call_start"],
            "matcher": "shell",
            "when": {"arguments.command": {"prefix": "git push"}},
            "decision": "ask",
            "reason": "pushing needs a person",
        },
        {
            "id": "allow-ls",
            "on": ["tool_call_start"],
            "matcher": "shell",
            "when": {"arguments.command": {"regex": "^ls\\b"}},
            "decision": "allow",
            "reason": "listing is fine",
        },
        {
            "id": "no-secrets",
            "on": ["prompt"],
            "when": {"prompt": {"regex": "(?i)password"}},
            "decision": "deny",
            "reason": "no secrets in prompts",
            "context": "secrets go in the vault",
        },
    ]
}


def write_policies(ws: Path, doc) -> None:
    tmp = ws / ".policies.json.tmp"
    tmp.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    os.replace(tmp, ws / "policies.json")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    write_policies(tmp_path, POLICIES)
    return tmp_path


def test_a_deny_rule_denies_with_its_reason_and_id(ws):
    with prx_hooks.Hooks(workspace=ws) as hooks:
        v = hooks.decide("tool_call_start", "my-agent", {"tool": "shell", "arguments": {"command": "rm -rf build"}})
        assert isinstance(v, prx_hooks.Verdict)
        assert (v.decision, v.policy, v.reason) == ("deny", "no-rm-rf", "rm -rf is not allowed in this workspace")
        assert v.denied
        assert isinstance(v.elapsed, float) and 0 <= v.elapsed < 10
        assert v.elapsed_us == int(v.elapsed * 1e6) or abs(v.elapsed_us - v.elapsed * 1e6) <= 1
        assert v.to_dict() == {
            "decision": "deny",
            "reason": "rm -rf is not allowed in this workspace",
            "policy": "no-rm-rf",
            "elapsed_us": v.elapsed_us,
        }
        # Each agent's shell tool, as that agent names it; JSON text works as a dict does.
        for tool in ["Bash", "run_shell_command", "exec_command"]:
            payload = json.dumps({"tool": tool, "arguments": {"command": "cd / && rm -fr x"}})
            assert hooks.decide("tool_call_start", "a", payload).decision == "deny"


def test_nothing_matching_is_no_decision_not_allow(ws):
    with prx_hooks.Hooks(workspace=ws) as hooks:
        for payload in [
            {"tool": "shell", "arguments": {"command": "cargo build"}},
            {"tool": "Read", "arguments": {"command": "rm -rf /"}},  # matcher: not a shell tool
            {"tool": "shell", "arguments": {}},  # a missing path is no match
            {"tool": "shell"},
        ]:
            v = hooks.decide("tool_call_start", "a", payload)
            assert (v.decision, v.policy, v.reason, v.context) == (None, None, None, None), payload
            assert not v.denied
        assert hooks.decide("permission", "a").decision is None  # no payload: {}
        assert hooks.decide("tool_call_start", "a", None).decision is None


def test_allow_ask_and_the_most_restrictive_wins(ws):
    with prx_hooks.Hooks(workspace=ws) as hooks:
        allow = hooks.decide("tool_call_start", "a", {"tool": "shell", "arguments": {"command": "ls -l"}})
        assert (allow.decision, allow.policy, allow.reason) == ("allow", "allow-ls", "listing is fine")
        ask = hooks.decide("tool_call_start", "a", {"tool": "shell", "arguments": {"command": "git push"}})
        assert (ask.decision, ask.policy) == ("ask", "ask-push")
        # `ls` is allowed, `rm -rf` in the same command is denied: deny > allow.
        both = hooks.decide("tool_call_start", "a", {"tool": "shell", "arguments": {"command": "ls; rm -rf ."}})
        assert (both.decision, both.policy) == ("deny", "no-rm-rf")
        prompt = hooks.decide("prompt", "a", {"prompt": "my Password is hunter2"})
        assert (prompt.decision, prompt.policy, prompt.context) == ("deny", "no-secrets", "secrets go in the vault")
        assert prompt.to_dict()["context"] == "secrets go in the vault"
        stats = hooks.stats()["policies"]
        assert (stats["allow"], stats["ask"], stats["deny"], stats["none"], stats["refused"]) == (1, 1, 2, 0, 0)
        counts = {c["policy"]: c["decisions"] for c in stats["by_policy"]}
        assert counts == {"no-rm-rf": 1, "ask-push": 1, "allow-ls": 1, "no-secrets": 1}


def test_bad_questions_raise_with_the_librarys_message_and_are_counted(ws):
    with prx_hooks.Hooks(workspace=ws) as hooks:
        with pytest.raises(ValueError, match=r'^point="tool_call": not a decision point; expected one of tool_call_start, prompt, permission$'):
            hooks.decide("tool_call", "a", {})
        with pytest.raises(prx_hooks.DecideError, match=r"^payload: the payload is not a JSON object: "):
            hooks.decide("tool_call_start", "a", "[1, 2]")
        with pytest.raises(prx_hooks.DecideError, match=r"^payload: the payload is not a JSON object: .*line 1 column"):
            hooks.decide("tool_call_start", "a", "{not json")
        big = {"tool": "shell", "arguments": {"command": "x" * (1 << 20)}}
        with pytest.raises(prx_hooks.DecideError, match=r"^payload: the payload is \d+ bytes; a decision reads at most 1048576 bytes$"):
            hooks.decide("tool_call_start", "a", big)
        assert issubclass(prx_hooks.DecideError, ValueError)
        with pytest.raises(TypeError, match=r"^payload: expected a dict or JSON text \(str\), got list$"):
            hooks.decide("tool_call_start", "a", [1])
        with pytest.raises(TypeError, match=r"^payload\[\"arguments\"\]\[\"s\"\]: "):
            hooks.decide("tool_call_start", "a", {"tool": "shell", "arguments": {"s": {1, 2}}})
        stats = hooks.stats()["policies"]
        assert stats["refused"] == 3
        assert (stats["allow"], stats["ask"], stats["deny"], stats["none"]) == (0, 0, 0, 0)


def test_without_policies_nothing_decides(tmp_path):
    with prx_hooks.Hooks(workspace=None) as hooks:
        v = hooks.decide("tool_call_start", "a", {"tool": "shell", "arguments": {"command": "rm -rf /"}})
        assert v.decision is None
    with prx_hooks.Hooks(workspace=tmp_path) as hooks:  # a workspace without policies.json
        assert hooks.decide("tool_call_start", "a", {"tool": "Bash", "arguments": {"command": "rm -rf /"}}).decision is None


def test_policies_json_hot_reloads_and_a_bad_file_keeps_the_last_good(ws):
    with prx_hooks.Hooks(workspace=ws, reload_debounce=0.01) as hooks:
        rm = {"tool": "shell", "arguments": {"command": "rm -rf x"}}
        assert hooks.decide("tool_call_start", "a", rm).decision == "deny"
        write_policies(ws, '{"policies": [{"id": "x", "decision": "maybe"}]}')
        wait_for("the bad file to be refused", lambda: hooks.stats()["policies"]["file"]["failing"])
        assert "policies.json:1:" in hooks.stats()["policies"]["file"]["last_error"]
        assert hooks.decide("tool_call_start", "a", rm).decision == "deny"  # last good kept
        write_policies(ws, {"policies": []})
        wait_for("the empty file to apply", lambda: hooks.decide("tool_call_start", "a", rm).decision is None)


def test_a_decision_is_published_on_the_bus(ws):
    with prx_hooks.Hooks(workspace=ws) as hooks:
        sub = hooks.bus.subscribe("prx.policy.decision")
        hooks.decide("tool_call_start", "my-agent", {"tool": "shell", "arguments": {"command": "rm -rf x"}})
        msg = sub.recv(timeout=10)
        assert msg.agent == "my-agent"
        p = msg.payload
        assert (p["point"], p["decision"], p["policy"], p["reason"]) == (
            "tool_call_start",
            "deny",
            "no-rm-rf",
            "rm -rf is not allowed in this workspace",
        )


def test_within_cuts_a_slower_guard_and_it_answers_its_on_error(tmp_path):
    # A command policy whose guard sleeps far past what the caller waits: `within` cuts it, and
    # its on_error (deny) answers; without `within`, only its own timeout_ms would.
    guard = tmp_path / "slow-guard.sh"
    guard.write_text("#!/bin/sh\nsleep 5\n")
    guard.chmod(0o755)
    write_policies(
        tmp_path,
        {
            "policies": [
                {
                    "id": "slow-guard",
                    "on": ["tool_call_start"],
                    "command": str(guard),
                    "timeout_ms": 10000,
                    "on_error": "deny",
                }
            ]
        },
    )
    with prx_hooks.Hooks(workspace=tmp_path) as hooks:
        payload = {"tool": "shell", "arguments": {"command": "ls"}}
        start = time.monotonic()
        v = hooks.decide("tool_call_start", "a", payload, within=0.3)
        took = time.monotonic() - start
        assert v.decision == "deny" and v.policy == "slow-guard", v.to_dict()
        assert "timed out" in (v.reason or ""), v.to_dict()
        # Liveness, with slack: well before the guard's own 10 s or its 5 s sleep.
        assert took < 4.0, took
        with pytest.raises(ValueError, match=r"^within=-1\.0: expected a number of seconds, 0 or more$"):
            hooks.decide("tool_call_start", "a", payload, within=-1.0)
        with pytest.raises(TypeError):
            hooks.decide("tool_call_start", "a", payload, 0.3)  # keyword only
