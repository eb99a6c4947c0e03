"""A real LangGraph prebuilt agent, driven by LangChain's own fake chat model, calling real
tools: the hooks of hooks.json see each tool call, and a slow hook does not slow the agent."""

from __future__ import annotations

import time
import warnings

import pytest

pytest.importorskip("langgraph")

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # create_react_agent's deprecation notice
    from langgraph.prebuilt import create_react_agent

import prx_hooks
from prx_hooks.langchain import PrxCallbackHandler
from conftest import read_log, recorder_hook, wait_for, write_hooks

CALLS: list = []


@tool
def read_file(path: str) -> str:
    """Reads a file of the project."""
    CALLS.append(("read_file", path))
    return f"contents of {path}"


@tool
def shell(cmd: str, cwd: str = ".") -> str:
    """Runs a command."""
    CALLS.append(("shell", cmd))
    if cmd == "false":
        raise ValueError("exit status 1")
    return "41 passed; 1 failed"


TOOL_CALLS = [
    ("read_file", {"path": "src/lib.rs"}),
    ("shell", {"cmd": "cargo test", "cwd": "/src/app"}),
    ("read_file", {"path": "README.md"}),
]


def agent(tool_calls=TOOL_CALLS):
    responses = [
        AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call_{n}"}])
        for n, (name, args) in enumerate(tool_calls)
    ] + [AIMessage(content="All done.")]
    model = FakeMessagesListChatModel(responses=responses)
    tools = [read_file, shell]
    # Tools bound the way bind_tools binds them (the fake model has no bind_tools of its own).
    bound = model.bind(tools=[convert_to_openai_tool(t) for t in tools])
    return create_react_agent(bound, tools)


def run(graph, handler=None):
    config = {"callbacks": [handler]} if handler else {}
    return graph.invoke({"messages": [("user", "fix the failing test")]}, config=config)


def test_a_langgraph_agent_run_reaches_the_hooks_tool_call_by_tool_call(workspace):
    log = workspace / "calls.log"
    write_hooks(workspace, {"tool_call_start": [recorder_hook(log)]})
    CALLS.clear()
    with prx_hooks.Hooks(workspace=workspace) as hooks:
        sub = hooks.bus.subscribe("*")
        handler = PrxCallbackHandler(hooks.emitter("coder", "lg-1"))
        result = run(agent(), handler)
        assert result["messages"][-1].content == "All done."
        assert CALLS == [("read_file", "src/lib.rs"), ("shell", "cargo test"), ("read_file", "README.md")]
        wait_for("a hook run per tool call", lambda: len(read_log(log)) == 3)
        events = [sub.recv(timeout=10) for _ in range(17)]
        time.sleep(0.2)
        assert sub.try_recv() is None
    # The hook got each call's tool name and arguments, in order.
    assert [(p["tool"], p["arguments"]) for _, p in read_log(log)] == TOOL_CALLS
    kinds = [m.event for m in events]
    assert kinds == (
        ["agent_start"]
        + ["llm_request", "llm_response", "tool_call_start", "tool_call"] * 3
        + ["llm_request", "llm_response", "turn_complete", "agent_end"]
    )
    payloads = [m.payload for m in events]
    starts = [p for m, p in zip(events, payloads) if m.event == "tool_call_start"]
    ends = [p for m, p in zip(events, payloads) if m.event == "tool_call"]
    assert [s["tool_call_id"] for s in starts] == ["call_0", "call_1", "call_2"]
    assert [e["run_id"] for e in ends] == [s["run_id"] for s in starts]
    assert [e["output"] for e in ends] == ["contents of src/lib.rs", "41 passed; 1 failed", "contents of README.md"]
    assert all(e["success"] for e in ends)
    request = payloads[1]
    assert request["messages_count"] == 1 and request["provider"] and request["model"]
    assert payloads[13]["messages_count"] == 7  # the last request: user + 3 × (AI, tool)
    assert payloads[-1]["success"] is True and payloads[-1]["messages_count"] == 8
    assert payloads[0]["run_id"] == payloads[-1]["run_id"] == payloads[-2]["run_id"]


def test_a_failing_tool_is_a_failed_tool_call_and_a_failed_run(workspace):
    CALLS.clear()
    with prx_hooks.Hooks(workspace=None) as hooks:
        sub = hooks.bus.subscribe("prx.lifecycle.*")
        handler = PrxCallbackHandler(hooks.emitter("coder", "lg-2"))
        graph = agent([("shell", {"cmd": "false"})])
        with pytest.raises(ValueError, match="exit status 1"):
            run(graph, handler)  # LangGraph's ToolNode lets a tool's own exception through
        got = [sub.recv(timeout=10) for _ in range(9)]
    assert [m.event for m in got] == [
        "agent_start", "llm_request", "llm_response", "tool_call_start", "tool_call", "error",
        "error", "turn_complete", "agent_end"]
    p = [m.payload for m in got]
    assert (p[4]["success"], p[4]["output"]) == (False, "ValueError: exit status 1")
    assert (p[5]["component"], p[5]["run_id"]) == ("tool", p[4]["run_id"])
    assert (p[6]["component"], p[6]["run_id"]) == ("langchain", p[0]["run_id"])
    assert p[8]["success"] is False


def test_a_hook_that_sleeps_10_s_does_not_slow_the_agent(workspace):
    write_hooks(workspace, {"tool_call_start": [
        {"command": "/bin/sleep", "args": ["10"], "timeout_ms": 30000}]})
    run(agent())  # warm: imports, graph compilation paths
    baseline = []
    for _ in range(3):
        started = time.monotonic()
        run(agent())
        baseline.append(time.monotonic() - started)
    with prx_hooks.Hooks(workspace=workspace) as hooks:
        handler = PrxCallbackHandler(hooks.emitter("coder", "lg-3"))
        started = time.monotonic()
        run(agent(), handler)
        with_hooks = time.monotonic() - started
        shell = hooks.stats()["shell"]["totals"]
        assert shell["running"] + shell["queued"] + shell["ok"] >= 1, "the sleeping hook did not start"
        assert shell["ok"] == 0, "a 10 s hook finished during a run that should take milliseconds"
        hooks.shutdown(0.5)  # kills the sleeping hooks
    # 3 tool calls × 10 s would be 30 s if the agent waited; the slack covers a busy machine.
    assert with_hooks < min(baseline) + 3.0, (with_hooks, baseline)
