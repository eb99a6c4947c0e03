"""PrxToolGuard: a real LangGraph prebuilt agent on LangChain's fake chat model asks a real
policies.json before each tool call; a denied tool's body never runs and the model is told the
policy's reason."""

from __future__ import annotations

import asyncio
import warnings

import pytest

pytest.importorskip("langgraph")

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # create_react_agent's deprecation notice
    from langgraph.prebuilt import ToolNode, create_react_agent

import prx_hooks
from prx_hooks.langchain import PrxToolGuard
from test_decide import POLICIES, write_policies

RAN: list = []


@tool
def shell(command: str) -> str:
    """Runs a shell command."""
    RAN.append(command)
    return f"ran {command}"


def agent(commands, tools_or_node):
    responses = [
        AIMessage(content="", tool_calls=[{"name": "shell", "args": {"command": c}, "id": f"call_{n}"}])
        for n, c in enumerate(commands)
    ] + [AIMessage(content="Done.")]
    model = FakeMessagesListChatModel(responses=responses)
    bound = model.bind(tools=[convert_to_openai_tool(shell)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent's deprecation notice
        return create_react_agent(bound, tools_or_node)


def tool_messages(result):
    return [(m.tool_call_id, m.status, m.content) for m in result["messages"] if isinstance(m, ToolMessage)]


COMMANDS = ["ls -l", "rm -rf /tmp/victim", "cargo build", "git push origin main"]
EXPECTED = [
    ("call_0", "success", "ran ls -l"),  # allow
    ("call_1", "error", "rm -rf is not allowed in this workspace"),  # deny
    ("call_2", "success", "ran cargo build"),  # no decision
    ("call_3", "error", "pushing needs a person"),  # ask: no one to ask, refused
]


@pytest.fixture
def hooks(tmp_path):
    write_policies(tmp_path, POLICIES)
    with prx_hooks.Hooks(workspace=tmp_path) as h:
        yield h


def test_a_tool_node_wrapper_keeps_denied_tools_from_running(hooks):
    RAN.clear()
    guard = PrxToolGuard(hooks, "coder")
    node = ToolNode([shell], wrap_tool_call=guard, awrap_tool_call=guard.awrap)
    result = agent(COMMANDS, node).invoke({"messages": [("user", "clean up")]})
    assert RAN == ["ls -l", "cargo build"]
    assert tool_messages(result) == EXPECTED
    assert result["messages"][-1].content == "Done."
    p = hooks.stats()["policies"]
    assert (p["allow"], p["ask"], p["deny"], p["none"]) == (1, 1, 1, 1)


def test_the_async_path_asks_too(hooks):
    RAN.clear()
    guard = PrxToolGuard(hooks, "coder")
    node = ToolNode([shell], wrap_tool_call=guard, awrap_tool_call=guard.awrap)
    graph = agent(COMMANDS, node)
    result = asyncio.run(graph.ainvoke({"messages": [("user", "clean up")]}))
    assert RAN == ["ls -l", "cargo build"]
    assert tool_messages(result) == EXPECTED


def test_guarded_tools_work_without_a_tool_node(hooks):
    RAN.clear()
    guarded = PrxToolGuard(hooks, "coder").tools([shell])
    assert (guarded[0].name, guarded[0].description) == (shell.name, shell.description)
    result = agent(COMMANDS, guarded).invoke({"messages": [("user", "clean up")]})
    assert RAN == ["ls -l", "cargo build"]
    assert tool_messages(result) == EXPECTED
    # Invoked directly with its arguments: the reason comes back as the tool's output.
    assert guarded[0].invoke({"command": "rm -rf x"}) == "rm -rf is not allowed in this workspace"
    assert guarded[0].invoke({"command": "echo hi"}) == "ran echo hi"
    assert RAN[-1] == "echo hi"


def test_on_error_deny_refuses_a_call_the_policies_cannot_be_asked_about(hooks):
    RAN.clear()
    huge = "x" * (1 << 20)
    guard = PrxToolGuard(hooks, "coder")
    node = ToolNode([shell], wrap_tool_call=guard)
    agent([huge], node).invoke({"messages": [("user", "go")]})
    assert RAN == [huge]  # on_error "none": no decision, it runs
    strict = PrxToolGuard(hooks, "coder", on_error="deny")
    result = agent([huge], ToolNode([shell], wrap_tool_call=strict)).invoke({"messages": [("user", "go")]})
    assert RAN == [huge]
    [(_, status, content)] = tool_messages(result)
    assert status == "error"
    assert content.startswith("the policies could not decide (payload: the payload is ")
    assert hooks.stats()["policies"]["refused"] == 2
    with pytest.raises(ValueError, match='on_error=.maybe.: expected "none" or "deny"'):
        PrxToolGuard(hooks, "coder", on_error="maybe")


def test_with_an_emitter_a_refused_call_is_emitted_with_its_decision(hooks):
    RAN.clear()
    sub = hooks.bus.subscribe("prx.lifecycle.*")
    guard = PrxToolGuard(hooks, "coder", emitter=hooks.emitter("coder", "lg-audit"))
    node = ToolNode([shell], wrap_tool_call=guard)
    agent(COMMANDS, node).invoke({"messages": [("user", "clean up")]})
    assert RAN == ["ls -l", "cargo build"]
    got = []
    for _ in range(3):
        m = sub.recv(timeout=10)
        got.append((m.event, m.session, m.payload))
    assert sub.try_recv() is None
    assert got == [
        ("tool_call_start", "lg-audit", {
            "tool": "shell", "arguments": {"command": "rm -rf /tmp/victim"}, "tool_call_id": "call_1",
            "policy_decision": "deny", "policy_id": "no-rm-rf",
            "policy_reason": "rm -rf is not allowed in this workspace"}),
        # An ask refused for want of someone to ask: the start, then the call's failed end.
        ("tool_call_start", "lg-audit", {
            "tool": "shell", "arguments": {"command": "git push origin main"}, "tool_call_id": "call_3",
            "policy_decision": "ask", "policy_id": "ask-push", "policy_reason": "pushing needs a person"}),
        ("tool_call", "lg-audit", {
            "tool": "shell", "success": False, "output": "pushing needs a person", "tool_call_id": "call_3"}),
    ]


def test_with_the_callback_handler_every_tool_call_start_carries_its_decision(hooks):
    from prx_hooks.langchain import PrxCallbackHandler

    RAN.clear()
    em = hooks.emitter("coder", "lg-audit-2")
    sub = hooks.bus.subscribe("prx.lifecycle.tool_call_start")
    guard = PrxToolGuard(hooks, "coder", emitter=em)
    handler = PrxCallbackHandler(em, guard=guard)
    node = ToolNode([shell], wrap_tool_call=guard)
    agent(COMMANDS, node).invoke({"messages": [("user", "clean up")]}, config={"callbacks": [handler]})
    assert RAN == ["ls -l", "cargo build"]
    starts = [sub.recv(timeout=10).payload for _ in range(4)]
    assert sub.try_recv() is None
    fields = ("tool_call_id", "policy_decision", "policy_id", "policy_reason")
    assert [tuple(p.get(f) for f in fields) for p in starts] == [
        ("call_0", "allow", "allow-ls", "listing is fine"),  # ran: the handler's start
        ("call_1", "deny", "no-rm-rf", "rm -rf is not allowed in this workspace"),  # the guard's
        ("call_2", None, None, None),  # ran, no policy decided
        ("call_3", "ask", "ask-push", "pushing needs a person"),  # the guard's
    ]
    assert guard.take_decision("call_0") == {}  # given once
