"""A real OpenAI Agents SDK run with a fake Model (the SDK's Model interface: tool calls, then
a final answer) and real function tools: the hooks of hooks.json see each tool call, and a
slow hook does not slow the agent. No network: the SDK's own trace exporter is replaced."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

pytest.importorskip("agents")

from agents import Agent, ModelResponse, Runner, Usage, function_tool, set_trace_processors
from agents.models.interface import Model
from agents.tracing import generation_span
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import prx_hooks
from prx_hooks.openai_agents import PrxRunHooks, PrxTracingProcessor
from conftest import read_log, recorder_hook, wait_for, write_hooks

CALLS: list = []


@function_tool
def read_file(path: str) -> str:
    """Reads a file of the project."""
    CALLS.append(("read_file", path))
    return f"contents of {path}"


@function_tool
def shell(cmd: str, cwd: str) -> str:
    """Runs a command."""
    CALLS.append(("shell", cmd))
    if cmd == "false":
        raise RuntimeError("exit status 1")
    return "41 passed; 1 failed"


TOOL_CALLS = [
    ("read_file", {"path": "src/lib.rs"}),
    ("shell", {"cmd": "cargo test", "cwd": "/src/app"}),
    ("read_file", {"path": "README.md"}),
]


class FakeModel(Model):
    """Answers each turn from a script: one function call per turn, then a message. Like the
    SDK's own models, it opens a generation span for each call."""

    def __init__(self, tool_calls):
        self.turns = [
            [ResponseFunctionToolCall(id=f"fc_{n}", call_id=f"call_{n}", type="function_call",
                                      name=name, arguments=json.dumps(args))]
            for n, (name, args) in enumerate(tool_calls)
        ] + [[ResponseOutputMessage(
            id="msg", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(text="All done.", type="output_text", annotations=[])])]]

    async def get_response(self, system_instructions, input, model_settings, tools,
                           output_schema, handoffs, tracing, *, previous_response_id=None,
                           conversation_id=None, prompt=None):
        items = input if isinstance(input, list) else [{"role": "user", "content": input}]
        with generation_span(model="fake-model", input=items,
                             disabled=tracing.is_disabled()) as span:
            output = self.turns.pop(0)
            usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
            span.span_data.usage = {"input_tokens": 10, "output_tokens": 5}
        return ModelResponse(output=output, usage=usage, response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the tests run without streaming")


def agent(tool_calls=TOOL_CALLS):
    return Agent(name="coder", instructions="Fix the failing test.",
                 model=FakeModel(tool_calls), tools=[read_file, shell])


def run(a, hooks=None):
    result = asyncio.run(Runner.run(a, "fix the failing test", hooks=hooks))
    return result.final_output


@pytest.fixture(autouse=True)
def no_exporter():
    set_trace_processors([])  # the SDK's exporter would try to reach OpenAI
    yield
    set_trace_processors([])


def test_run_hooks_bring_each_tool_call_to_the_hooks(workspace):
    log = workspace / "calls.log"
    write_hooks(workspace, {"tool_call_start": [recorder_hook(log)]})
    CALLS.clear()
    with prx_hooks.Hooks(workspace=workspace) as hooks:
        sub = hooks.bus.subscribe("*")
        assert run(agent(), PrxRunHooks(hooks.emitter("coder", "oa-1"))) == "All done."
        wait_for("a hook run per tool call", lambda: len(read_log(log)) == 3)
        events = [sub.recv(timeout=10) for _ in range(17)]
        time.sleep(0.2)
        assert sub.try_recv() is None
    assert CALLS == [("read_file", "src/lib.rs"), ("shell", "cargo test"), ("read_file", "README.md")]
    assert [(p["tool"], p["arguments"]) for _, p in read_log(log)] == TOOL_CALLS
    assert [m.event for m in events] == (
        ["agent_start"]
        + ["llm_request", "llm_response", "tool_call_start", "tool_call"] * 3
        + ["llm_request", "llm_response", "turn_complete", "agent_end"]
    )
    p = [m.payload for m in events]
    assert p[0]["agent_name"] == "coder"
    assert (p[1]["provider"], p[1]["model"], p[1]["messages_count"]) == ("FakeModel", "FakeModel", 2)
    assert p[2]["success"] is True and p[2]["input_tokens"] == 10
    assert [(x["tool_call_id"], x["tool"]) for x in p if "arguments" in x] == [
        ("call_0", "read_file"), ("call_1", "shell"), ("call_2", "read_file")]
    # The arguments reach hooks as the model wrote them (JSON text, embedded as is).
    assert events[3].json == '{"tool":"read_file","arguments":{"path": "src/lib.rs"},"agent_name":"coder","tool_call_id":"call_0"}'.replace(': "', ':"')
    assert [x["output"] for x in p if "output" in x] == [
        "contents of src/lib.rs", "41 passed; 1 failed", "contents of README.md"]
    assert p[-1]["success"] is True and p[-1]["input_tokens"] == 40


def test_the_tracing_processor_sees_the_run_and_its_failures(workspace):
    log = workspace / "calls.log"
    write_hooks(workspace, {"tool_call_start": [recorder_hook(log)]})
    with prx_hooks.Hooks(workspace=workspace) as hooks:
        sub = hooks.bus.subscribe("*")
        set_trace_processors([PrxTracingProcessor(hooks.emitter("coder", "oa-2"))])
        run(agent([("read_file", {"path": "a.rs"}), ("shell", {"cmd": "false", "cwd": "/"})]))
        wait_for("a hook run per tool call", lambda: len(read_log(log)) == 2)
        events = []
        while not events or events[-1].event != "agent_end":
            events.append(sub.recv(timeout=10))
    kinds = [m.event for m in events]
    assert kinds[0] == "agent_start" and kinds[-2:] == ["turn_complete", "agent_end"]
    assert kinds.count("llm_request") == kinds.count("llm_response") == 3
    starts = [m.payload for m in events if m.event == "tool_call_start"]
    ends = [m.payload for m in events if m.event == "tool_call"]
    assert [(s["tool"], s["arguments"]) for s in starts] == [
        ("read_file", {"path": "a.rs"}), ("shell", {"cmd": "false", "cwd": "/"})]
    assert [e["success"] for e in ends] == [True, False]
    errors = [m.payload for m in events if m.event == "error"]
    assert errors and errors[0]["component"] == "function" and errors[0]["span_id"] == ends[1]["span_id"]
    responses = [m.payload for m in events if m.event == "llm_response"]
    assert {r["model"] for r in responses} == {"fake-model"} and responses[0]["input_tokens"] == 10
    assert events[-1].payload["success"] is False
    assert len({m.payload["trace_id"] for m in events}) == 1
    assert [(p["tool"], p["arguments"]) for _, p in read_log(log)] == [
        ("read_file", {"path": "a.rs"}), ("shell", {"cmd": "false", "cwd": "/"})]


def test_a_hook_that_sleeps_10_s_does_not_slow_the_agent(workspace):
    write_hooks(workspace, {"tool_call_start": [
        {"command": "/bin/sleep", "args": ["10"], "timeout_ms": 30000}]})
    run(agent())
    baseline = []
    for _ in range(3):
        started = time.monotonic()
        run(agent())
        baseline.append(time.monotonic() - started)
    with prx_hooks.Hooks(workspace=workspace) as hooks:
        started = time.monotonic()
        run(agent(), PrxRunHooks(hooks.emitter("coder", "oa-3")))
        with_hooks = time.monotonic() - started
        shell = hooks.stats()["shell"]["totals"]
        assert shell["running"] + shell["queued"] >= 1, "the sleeping hook did not start"
        assert shell["ok"] == 0
        hooks.shutdown(0.5)
    assert with_hooks < min(baseline) + 3.0, (with_hooks, baseline)
