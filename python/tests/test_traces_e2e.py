"""Sessions in traces, end to end: the sample workspace's events, a LangGraph run, an OpenAI
Agents SDK run with a handoff and two concurrent runs, and a Gemini CLI session's hook payloads,
all through one real `prx-hooks run --listen --otlp` to a real OTLP receiver (otlp.py). The
receiver's spans are checked for their tree, their times (the agent's own clock), token usage
on the chat spans, and no content (the server runs without --otlp-content).

The Python frameworks emit into this process's `prx_hooks.Hooks`; its bus messages are posted
to the server as `POST /api/events`, each with its own time in `Prx-Timestamp`, a second after
the runs ended: spans placed at ingest time would be a second late."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Dict, List


from agents import Agent, Runner, set_trace_processors
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # create_react_agent's deprecation notice
    from langgraph.prebuilt import create_react_agent

import prx_hooks
from prx_hooks.langchain import PrxCallbackHandler
from prx_hooks.openai_agents import PrxRunHooks, PrxTracingProcessor
from conftest import REPO, Server
from otlp import Receiver, Span, children, render
from test_openai_agents import FakeModel, handoff_agents, read_file as sdk_read_file

# Every piece of content the agents send holds this: no exported attribute may.
SECRET = "SECRET-7f3a"


def rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ns(t) -> int:
    """Nanoseconds since the epoch of a datetime or an RFC 3339 text in UTC."""
    if isinstance(t, str):
        t = datetime.fromisoformat(t.replace("Z", "+00:00"))
    delta = t - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


# ---------------------------------------------------------------------------------------------
# The sources


def sample_workspace(ws: Path) -> None:
    root = REPO / "examples" / "workspace"
    shutil.copy(root / "hooks.json", ws / "hooks.json")
    (ws / "hooks").mkdir()
    shutil.copy(root / "hooks" / "audit.sh", ws / "hooks" / "audit.sh")


def send_sample(server: Server, start: datetime) -> List[datetime]:
    """The sample workspace's events, one request each, 100 ms apart from `start`."""
    lines = (REPO / "examples" / "workspace" / "events.ndjson").read_text().splitlines()
    times = [start + timedelta(milliseconds=100 * n) for n in range(len(lines))]
    for line, at in zip(lines, times):
        server.post_events([line], rfc3339(at))
    return times


GEMINI_SESSION = "gemini-e2e-1"


def gemini_payloads(start: datetime) -> List[dict]:
    """A Gemini CLI turn's hook payloads as its hook reference documents them
    (tests/fixtures/agents/gemini-cli), each stamped a second after the one before."""
    base = {"session_id": GEMINI_SESSION, "cwd": f"/home/{SECRET}/demo",
            "transcript_path": f"/home/{SECRET}/.gemini/tmp/chats/session-1.json"}
    request = {"model": "gemini-2.5-pro",
               "messages": [{"role": "user", "content": f"Summarize the README {SECRET}"}]}
    events = [
        {"hook_event_name": "BeforeAgent", "prompt": f"Summarize the README {SECRET}"},
        {"hook_event_name": "BeforeModel", "llm_request": request},
        {"hook_event_name": "AfterModel", "llm_request": request, "llm_response": {
            "text": f"Let me list the files {SECRET}",
            "candidates": [{"content": {"role": "model", "parts": [SECRET]},
                            "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 1200, "candidatesTokenCount": 85,
                              "totalTokenCount": 1285, "cachedContentTokenCount": 1000}}},
        {"hook_event_name": "BeforeTool", "tool_name": "run_shell_command",
         "tool_input": {"command": f"ls {SECRET}"}},
        {"hook_event_name": "AfterTool", "tool_name": "run_shell_command",
         "tool_input": {"command": f"ls {SECRET}"},
         "tool_response": {"llmContent": SECRET, "returnDisplay": SECRET, "error": None}},
        {"hook_event_name": "AfterAgent", "prompt": f"Summarize the README {SECRET}",
         "prompt_response": f"The README explains {SECRET}", "stop_hook_active": False},
    ]
    return [{**base, **e, "timestamp": (start + timedelta(seconds=n)).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")} for n, e in enumerate(events)]


@tool
def lg_read_file(path: str) -> str:
    """Reads a file of the project."""
    return f"contents of {path} {SECRET}"


def langgraph_run(hooks: prx_hooks.Hooks) -> None:
    """LangGraph's prebuilt agent on LangChain's fake chat model: two tool calls, then an
    answer; every reply reports its usage."""
    usage = {"input_tokens": 120, "output_tokens": 30, "total_tokens": 150}
    responses = [
        AIMessage(content="", usage_metadata=usage, tool_calls=[
            {"name": "lg_read_file", "args": {"path": f"{SECRET}/{n}.rs"}, "id": f"lg_{n}"}])
        for n in range(2)
    ] + [AIMessage(content=f"All done {SECRET}.", usage_metadata=usage)]
    model = FakeMessagesListChatModel(responses=responses)
    bound = model.bind(tools=[convert_to_openai_tool(lg_read_file)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent's deprecation notice
        graph = create_react_agent(bound, [lg_read_file])
    handler = PrxCallbackHandler(hooks.emitter("langgraph", "lg-e2e"))
    result = graph.invoke({"messages": [("user", f"fix it {SECRET}")]},
                          config={"callbacks": [handler]})
    assert result["messages"][-1].content == f"All done {SECRET}."


def agents_sdk_runs(hooks: prx_hooks.Hooks) -> None:
    """A run where `coder` hands off to `reviewer` (run hooks), two concurrent runs that both
    hand off (run hooks), then two concurrent runs on one tracing processor."""
    set_trace_processors([])
    try:
        run_hooks = PrxRunHooks(hooks.emitter("openai-agents", "oa-handoff"), hooks=hooks)
        result = asyncio.run(Runner.run(handoff_agents(), f"fix it {SECRET}", hooks=run_hooks))
        assert result.final_output == "All done."

        shared = PrxRunHooks(hooks.emitter("openai-agents", "oa-hc"), hooks=hooks)

        async def both_hand_off():
            return await asyncio.gather(
                Runner.run(handoff_agents(0.02, "a.rs"), "one", hooks=shared),
                Runner.run(handoff_agents(0.01, "b.rs"), "two", hooks=shared))

        assert [r.final_output for r in asyncio.run(both_hand_off())] == ["All done."] * 2

        set_trace_processors([PrxTracingProcessor(hooks.emitter("openai-agents", "oa-conc"),
                                                  hooks=hooks)])

        async def both():
            one = Agent(name="coder", instructions="Fix it.", tools=[sdk_read_file],
                        model=FakeModel([("read_file", {"path": "a.rs"})] * 2, pause=0.02))
            two = Agent(name="coder", instructions="Fix it.", tools=[sdk_read_file],
                        model=FakeModel([("read_file", {"path": "b.rs"})] * 2, pause=0.01))
            return await asyncio.gather(Runner.run(one, "one"), Runner.run(two, "two"))

        assert [r.final_output for r in asyncio.run(both())] == ["All done.", "All done."]
    finally:
        set_trace_processors([])


def forward(server: Server, messages: List[prx_hooks.Message]) -> None:
    """Each bus message to the server with its own time (`Prx-Timestamp`)."""
    for m in messages:
        line = json.dumps({"event": m.event, "agent": m.agent, "session": m.session,
                           "payload": m.payload})
        server.post_events([line], m.timestamp_rfc3339)


# ---------------------------------------------------------------------------------------------
# Checks


def check_times(spans: List[Span], tree: str) -> None:
    """No span ends before it starts; a GenAI span lies within its parent; a hook ran after
    its event began (it may outlive it: it ran when the event reached the server)."""
    by_id = {s.span_id: s for s in spans}
    for s in spans:
        assert s.start <= s.end, f"{s.name} ends before it starts\n{tree}"
        parent = by_id.get(s.parent)
        if parent is None:
            assert not s.parent, f"{s.name}'s parent never arrived\n{tree}"
            continue
        assert parent.trace_id == s.trace_id, f"{s.name}\n{tree}"
        if s.name.startswith("execute_hook "):
            assert s.start >= parent.start, f"{s.name} ran before its event\n{tree}"
        else:
            assert parent.start <= s.start and s.end <= parent.end, (
                f"{s.name} [{s.start}, {s.end}] outside {parent.name} "
                f"[{parent.start}, {parent.end}]\n{tree}")


def one(spans: List[Span], pred, what: str, tree: str) -> Span:
    got = [s for s in spans if pred(s)]
    assert len(got) == 1, f"{len(got)} × {what}\n{tree}"
    return got[0]


def usage(s: Span) -> Dict[str, object]:
    return {k[len("gen_ai.usage."):]: v for k, v in s.attrs.items()
            if k.startswith("gen_ai.usage.")}


def check_handoff(trace: List[Span], run_session: str, tree: str) -> None:
    """One Agents SDK run where `coder` handed off to `reviewer`, through run hooks: one trace,
    the reviewer's agent span under the coder's, each with its own model and tool calls."""
    session = lambda s: s.attrs.get("session.id")  # noqa: E731
    coder = one(trace, lambda s: session(s) == run_session and s.name.startswith(
        "invoke_agent"), f"the coder's span of {run_session}", tree)
    reviewer = one(trace, lambda s: session(s) == f"{run_session}/reviewer"
                   and s.name.startswith("invoke_agent"), f"the reviewer's of {run_session}", tree)
    assert {s.trace_id for s in trace} == {coder.trace_id}, tree
    assert coder.parent == "" and reviewer.parent == coder.span_id, tree
    # Which agent each span is, without content: the SDK agent's name.
    assert (coder.attrs.get("prx.extra.agent_name"), reviewer.attrs.get("prx.extra.agent_name"),
            reviewer.attrs.get("prx.extra.handoff_from")) == ("coder", "reviewer", "coder"), (
        coder.attrs, reviewer.attrs)
    for a in (coder, reviewer):
        mine = [s for s in children(trace, a) if not s.name.startswith("execute_hook")]
        assert sum(s.name.startswith("execute_tool ") for s in mine) == 1, tree
        model_calls = [s for s in mine if s.name.startswith("chat ")]
        assert len(model_calls) == 2, tree
        for c in model_calls:
            assert usage(c) == {"input_tokens": 10, "output_tokens": 5}, c.attrs
            assert c.attrs["gen_ai.provider.name"] == "FakeModel"
        assert a.attrs["gen_ai.provider.name"] == "FakeModel"


def check_no_content(spans: List[Span], tree: str) -> None:
    for s in spans:
        for key in ("gen_ai.tool.call.arguments", "gen_ai.tool.call.result",
                    "prx.hook.stderr_tail"):
            assert key not in s.attrs, f"{s.name} carries {key}\n{tree}"
        leaked = {k: v for k, v in s.attrs.items() if SECRET in str(v)}
        assert not leaked, f"{s.name} carries content: {leaked}"
        assert SECRET not in s.name


def test_every_source_through_one_server_makes_the_traces_people_read(tmp_path):
    ws = tmp_path / "server"
    ws.mkdir()
    sample_workspace(ws)
    local = tmp_path / "python"
    local.mkdir()

    # The Python runs first, into this process's own hook system, their messages kept.
    with prx_hooks.Hooks(workspace=local) as hooks:
        sub = hooks.bus.subscribe("prx.lifecycle.*", capacity=4096)
        langgraph_run(hooks)
        agents_sdk_runs(hooks)
        messages = []
        while True:
            try:
                messages.append(sub.recv(timeout=1.0))
            except TimeoutError:
                break
    assert sub.dropped == 0
    ran_until = max(m.timestamp for m in messages)

    now = datetime.now(timezone.utc)
    sample_start = now - timedelta(minutes=1)
    gemini_start = (now - timedelta(hours=2)).replace(microsecond=0)  # Gemini stamps ms
    with Receiver() as rx:
        server = Server(ws, rx.url)
        try:
            time.sleep(max(0.0, ran_until + 1.0 - time.time()))
            sample_times = send_sample(server, sample_start)
            forward(server, messages)
            for payload in gemini_payloads(gemini_start):
                server.send_from("gemini-cli", payload)
            report = server.stop()
        finally:
            server.kill()
        spans = rx.snapshot()
    tree = render(spans)
    print(tree)

    otel = report["stats"]["otel"]
    assert otel["exported"] == otel["spans"] == len(spans), otel
    assert otel["unmatched_starts"] == 0 and otel["unmatched_ends"] == 0, otel
    assert set(rx.paths) == {"/v1/traces"}
    assert all(s.resource.get("service.name") == "prx-hooks" for s in spans)
    check_times(spans, tree)
    check_no_content(spans, tree)
    for s in spans:
        assert s.attrs.get("prx.end_reason") != "unfinished" and "unfinished" not in (
            s.status_message), f"{s.name}\n{tree}"
    roots = [s for s in spans if not s.parent]
    assert {s.name.split(" ")[0] for s in roots} == {"invoke_agent"}, tree
    session = lambda s: s.attrs.get("session.id")  # noqa: E731

    def traces_of(pred) -> List[Span]:
        """Every span (hook runs too: they carry no session) of the traces whose GenAI spans
        `pred` picks."""
        traces = {s.trace_id for s in spans if session(s) is not None and pred(str(session(s)))}
        return [s for s in spans if s.trace_id in traces]

    # The sample workspace: one trace, the agent's times to the microsecond.
    sample = traces_of(lambda x: x == "demo-1")
    agent = one(sample, lambda s: s.name == "invoke_agent coder", "sample agent", tree)
    assert {s.trace_id for s in sample} == {agent.trace_id}
    assert (agent.start, agent.end) == (ns(sample_times[0]), ns(sample_times[-1])), tree
    chat = one(sample, lambda s: s.name == "chat claude-sonnet", "sample chat", tree)
    assert (chat.parent, chat.kind, chat.start, chat.end) == (
        agent.span_id, "CLIENT", ns(sample_times[1]), ns(sample_times[2]))
    assert usage(chat) == {}, "the sample gives no tokens"
    shell = one(sample, lambda s: s.name == "execute_tool shell", "sample shell", tree)
    assert shell.parent == agent.span_id and shell.error, (shell, shell.attrs, shell.status_message)
    assert (shell.start, shell.end) == (ns(sample_times[3]), ns(sample_times[4]))
    assert sorted((h.name, h.attrs["prx.hook.outcome"]) for h in children(sample, shell)) == [
        ("execute_hook audit-github", "skipped"), ("execute_hook audit-tool-calls", "ok")], tree
    assert [h.name for h in children(sample, agent) if h.name.startswith("execute_hook")] == [
        "execute_hook audit-errors"], tree
    github = one(sample, lambda s: s.name == "execute_tool mcp__github__create_issue",
                 "sample github call", tree)
    assert sorted((h.name, h.attrs["prx.hook.outcome"]) for h in children(sample, github)) == [
        ("execute_hook audit-github", "ok"), ("execute_hook audit-tool-calls", "ok")], tree

    # LangGraph: one trace, a chat span per model call with its usage, the tools beside them.
    lg = traces_of(lambda x: x == "lg-e2e")
    lg_agent = one(lg, lambda s: s.name == "invoke_agent langgraph", "LangGraph agent", tree)
    assert {s.trace_id for s in lg} == {lg_agent.trace_id} and lg_agent.parent == ""
    lg_chats = [s for s in children(lg, lg_agent) if not s.name.startswith("execute_hook")]
    assert sorted(s.name.split(" ")[0] for s in lg_chats) == ["chat"] * 3 + ["execute_tool"] * 2
    for c in (s for s in lg_chats if s.name.startswith("chat ")):
        assert usage(c) == {"input_tokens": 120, "output_tokens": 30}, c.attrs
    tools = sorted((s for s in lg_chats if s.name.startswith("execute_tool")),
                   key=lambda s: s.start)
    assert [t.attrs["gen_ai.tool.call.id"] for t in tools] == ["lg_0", "lg_1"]
    lg_times = [ns(m.timestamp_rfc3339) for m in messages if m.session == "lg-e2e"]
    assert (lg_agent.start, lg_agent.end) == (lg_times[0], lg_times[-1]), tree

    # The Agents SDK's handoff: one trace, one agent span per agent, the reviewer's inside
    # the coder's, each with its own model calls and tool calls.
    handoff = traces_of(lambda x: x.startswith("oa-handoff"))
    check_handoff(handoff, "oa-handoff", tree)

    # Two concurrent runs that both hand off: a trace each, each with its own coder and
    # reviewer (the second run on a session of its own).
    hc = traces_of(lambda x: x.startswith("oa-hc"))
    hc_roots = [s for s in hc if not s.parent]
    assert len(hc_roots) == 2 and len({s.trace_id for s in hc}) == 2, tree
    assert sorted(session(s) == "oa-hc" for s in hc_roots) == [False, True], tree
    for root in hc_roots:
        check_handoff([s for s in hc if s.trace_id == root.trace_id], session(root), tree)

    # The two concurrent runs: a trace each, each with its own tool calls and model calls.
    conc = traces_of(lambda x: x.startswith("oa-conc/"))
    conc_roots = [s for s in conc if not s.parent]
    assert len(conc_roots) == 2 and len({s.trace_id for s in conc}) == 2, tree
    assert len({session(s) for s in conc_roots}) == 2
    for root in conc_roots:
        mine = [s for s in conc if s.trace_id == root.trace_id]
        assert {session(s) for s in mine} - {None} == {session(root)}
        assert sorted(s.name for s in children(conc, root)
                      if not s.name.startswith("execute_hook")) == (
            ["chat fake-model"] * 3 + ["execute_tool read_file"] * 2), tree
        for c in children(conc, root, "chat fake-model"):
            assert usage(c) == {"input_tokens": 10, "output_tokens": 5}, c.attrs
    # They overlapped in time: each began before the other ended.
    a, b = conc_roots
    assert a.start < b.end and b.start < a.end, tree

    # Gemini CLI: the turn at the payloads' own times (two hours ago), usage from
    # usageMetadata (the input count includes the cached tokens, as the conventions say).
    gem = traces_of(lambda x: x == GEMINI_SESSION)
    g_agent = one(gem, lambda s: s.name == "invoke_agent gemini-cli", "Gemini's agent", tree)
    g = lambda n: ns(gemini_start + timedelta(seconds=n))  # noqa: E731
    assert {s.trace_id for s in gem} == {g_agent.trace_id}
    assert (g_agent.start, g_agent.end) == (g(0), g(5))
    assert g_agent.attrs["gen_ai.provider.name"] == "gcp.gemini"
    g_chat = one(gem, lambda s: s.name == "chat gemini-2.5-pro", "Gemini's model call", tree)
    assert (g_chat.parent, g_chat.start, g_chat.end) == (g_agent.span_id, g(1), g(2))
    assert usage(g_chat) == {"input_tokens": 1200, "output_tokens": 85,
                             "cache_read.input_tokens": 1000}, g_chat.attrs
    g_tool = one(gem, lambda s: s.name == "execute_tool run_shell_command", "Gemini's tool", tree)
    assert (g_tool.parent, g_tool.start, g_tool.end) == (g_agent.span_id, g(3), g(4))
    assert not g_tool.error and g_tool.attrs["prx.content_withheld"] >= 1

    # Nothing else: every span belongs to one of the five sources.
    assert sum(map(len, (sample, lg, handoff, hc, conc, gem))) == len(spans), tree
