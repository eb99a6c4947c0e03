"""Opt-in: a real Arize Phoenix receives a Claude Code-like session through `prx-hooks run
--listen --transcripts --otlp`, and its own API shows the session, the span kinds and the
model calls' token counts and cost. Phoenix is too heavy to install for every run:

    python3 -m venv target/phoenix && target/phoenix/bin/pip install arize-phoenix
    PRX_HOOKS_PHOENIX=target/phoenix/bin/phoenix python -m pytest -q python/tests/test_phoenix.py

Without PRX_HOOKS_PHOENIX (the `phoenix` program) the test is skipped. Phoenix runs offline on
loopback, its data in a temporary directory."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import Server, wait_for

PHOENIX = os.environ.get("PRX_HOOKS_PHOENIX")
pytestmark = pytest.mark.skipif(
    not PHOENIX, reason="PRX_HOOKS_PHOENIX names no phoenix program (an opt-in check)")

SESSION = "phoenix-claude-1"
MODEL = "claude-sonnet-4-5"
# The transcript's two model calls: Anthropic's usage (input_tokens without the cached ones).
CALLS = [
    {"input_tokens": 100, "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 300,
     "output_tokens": 50},
    {"input_tokens": 20, "cache_read_input_tokens": 2400, "output_tokens": 30},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def get(url: str, body: dict = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture
def phoenix(tmp_path):
    port, grpc = free_port(), free_port()
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(tmp_path / "phoenix"),
           "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(grpc), "PHOENIX_TELEMETRY_ENABLED": "false"}
    log = (tmp_path / "phoenix.log").open("w")
    proc = subprocess.Popen([PHOENIX, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def up():
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as resp:
                return resp.status == 200
        except OSError:
            return proc.poll() is not None  # died: the assert below says so

    try:
        wait_for("phoenix serve to answer", up, timeout=120)
        assert proc.poll() is None, (tmp_path / "phoenix.log").read_text()[-4000:]
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def claude_session(server: Server, transcript: Path) -> None:
    """A Claude Code turn's hook payloads (tests/fixtures/agents/claude-code), its transcript
    written as Claude Code writes it while the turn goes on."""
    base = {"session_id": SESSION, "transcript_path": str(transcript), "cwd": "/home/user/demo",
            "permission_mode": "default"}
    lines = [{"type": "user", "message": {"role": "user", "content": "list the files"},
              "timestamp": stamp()}]
    server.send_from("claude-code", {**base, "hook_event_name": "UserPromptSubmit",
                                     "prompt": "list the files"})
    time.sleep(0.05)
    lines.append({"type": "assistant", "timestamp": stamp(), "message": {
        "id": "msg_1", "model": MODEL, "usage": CALLS[0]}})
    tool = {"tool_name": "Bash", "tool_input": {"command": "ls"}, "tool_use_id": "toolu_1"}
    server.send_from("claude-code", {**base, **tool, "hook_event_name": "PreToolUse"})
    time.sleep(0.05)
    server.send_from("claude-code", {**base, **tool, "hook_event_name": "PostToolUse",
                                     "tool_response": {"stdout": "a\nb", "exit_code": 0}})
    lines.append({"type": "user", "timestamp": stamp(), "message": {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a\nb"}]}})
    time.sleep(0.05)
    lines.append({"type": "assistant", "timestamp": stamp(), "message": {
        "id": "msg_2", "model": MODEL, "usage": CALLS[1]}})
    transcript.write_text("".join(json.dumps(line) + "\n" for line in lines))
    time.sleep(0.05)
    server.send_from("claude-code", {**base, "hook_event_name": "Stop",
                                     "stop_hook_active": False})


def test_phoenix_shows_a_claude_sessions_model_calls_with_their_tokens_and_cost(
        phoenix, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    server = Server(ws, phoenix, "--transcripts")
    try:
        claude_session(server, tmp_path / "session.jsonl")
        report = server.stop()
    finally:
        server.kill()
    assert report["stats"]["otel"]["exported"] == report["stats"]["otel"]["spans"] > 0, report

    def spans():
        got = get(phoenix + "/v1/projects/default/spans?limit=100")["data"]
        return got if len(got) >= 4 else None

    got = wait_for("Phoenix to store the spans", spans, timeout=30)
    kinds = sorted((s["name"], s["span_kind"]) for s in got)
    assert kinds == [("chat " + MODEL, "LLM"), ("chat " + MODEL, "LLM"),
                     ("execute_tool Bash", "TOOL"), ("invoke_agent claude-code", "AGENT")], kinds
    agent = next(s for s in got if s["span_kind"] == "AGENT")
    assert {s["context"]["trace_id"] for s in got} == {agent["context"]["trace_id"]}
    chats = sorted((s for s in got if s["span_kind"] == "LLM"), key=lambda s: s["start_time"])
    for span, usage in zip(chats, CALLS):
        assert span["parent_id"] == agent["context"]["span_id"]
        node = get(phoenix + "/graphql", {"query": """query ($id: ID!) { node(id: $id) {
            ... on Span { tokenCountPrompt tokenCountCompletion tokenCountTotal
                          costSummary { prompt { cost } completion { cost } total { cost } } } } }""",
                                          "variables": {"id": span["id"]}})["data"]["node"]
        prompt = (usage["input_tokens"] + usage["cache_read_input_tokens"]
                  + usage.get("cache_creation_input_tokens", 0))
        # Phoenix's prompt count is every input token, the cached ones included.
        assert (node["tokenCountPrompt"], node["tokenCountCompletion"]) == (
            prompt, usage["output_tokens"]), (node, span["attributes"])
        assert node["tokenCountTotal"] == prompt + usage["output_tokens"]
        assert span["attributes"]["llm.token_count.prompt_details.cache_read"] == (
            usage["cache_read_input_tokens"])
        # Priced from Phoenix's own model table: Claude Sonnet 4.5 is in it.
        cost = node["costSummary"]
        assert cost["total"]["cost"] and cost["prompt"]["cost"] and cost["completion"]["cost"]
    # The session: Phoenix groups it by session.id, with its tokens.
    sessions = get(phoenix + "/graphql", {"query": """{ projects { edges { node { name
        sessions(first: 10) { edges { node { sessionId numTraces
            tokenUsage { prompt completion total } } } } } } } }"""})
    nodes = [e["node"] for p in sessions["data"]["projects"]["edges"]
             for e in p["node"]["sessions"]["edges"]]
    assert [n["sessionId"] for n in nodes] == [SESSION], nodes
    total_prompt = sum(c["input_tokens"] + c["cache_read_input_tokens"]
                       + c.get("cache_creation_input_tokens", 0) for c in CALLS)
    assert nodes[0]["tokenUsage"]["prompt"] == total_prompt, nodes
    assert nodes[0]["tokenUsage"]["completion"] == sum(c["output_tokens"] for c in CALLS)
