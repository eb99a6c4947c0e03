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

    def __init__(self, tool_calls, name="fake-model", pause=0.0, ids="call"):
        self.name = name
        self.pause = pause
        self.turns = [
            [ResponseFunctionToolCall(id=f"fc_{n}", call_id=f"{ids}_{n}", type="function_call",
                                      name=name, arguments=json.dumps(args))]
            for n, (name, args) in enumerate(tool_calls)
        ] + [[ResponseOutputMessage(
            id="msg", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(text="All done.", type="output_text", annotations=[])])]]

    async def get_response(self, system_instructions, input, model_settings, tools,
                           output_schema, handoffs, tracing, *, previous_response_id=None,
                           conversation_id=None, prompt=None):
        items = input if isinstance(input, list) else [{"role": "user", "content": input}]
        if self.pause:
            await asyncio.sleep(self.pause)
        with generation_span(model=self.name, input=items,
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
    # The error comes while the failing tool's span is open: after its tool_call_start,
    # before its tool_call (the span builder puts the exception on the newest open span).
    failing = [(m.event, m.payload.get("span_id")) for m in events
               if m.payload.get("span_id") == ends[1]["span_id"]]
    assert failing == [("tool_call_start", ends[1]["span_id"]), ("error", ends[1]["span_id"]),
                       ("tool_call", ends[1]["span_id"])]
    responses = [m.payload for m in events if m.event == "llm_response"]
    assert {r["model"] for r in responses} == {"fake-model"} and responses[0]["input_tokens"] == 10
    assert {r["provider"] for r in responses} == {"openai"}
    # The model got the tool's error and finished the run: the run did not fail.
    assert events[-1].payload["success"] is True
    assert len({m.payload["trace_id"] for m in events}) == 1
    assert [(p["tool"], p["arguments"]) for _, p in read_log(log)] == [
        ("read_file", {"path": "a.rs"}), ("shell", {"cmd": "false", "cwd": "/"})]


def handoff_agents(pause=0.0, path="a.rs"):
    """`coder` hands off to `reviewer` (the SDK's `transfer_to_reviewer` tool), which answers."""
    reviewer = Agent(name="reviewer", instructions="Review the fix.",
                     model=FakeModel([("read_file", {"path": "src/lib.rs"})], ids="review",
                                     pause=pause),
                     tools=[read_file])
    return Agent(name="coder", instructions="Fix the failing test.",
                 model=FakeModel([("read_file", {"path": path}), ("transfer_to_reviewer", {})],
                                 pause=pause),
                 tools=[read_file], handoffs=[reviewer])


def until_agent_end(sub, session):
    """The events up to `session`'s agent_end (all of them if it does not come in 10 s)."""
    events = []
    while not events or (events[-1].event, events[-1].session) != ("agent_end", session):
        try:
            events.append(sub.recv(timeout=10))
        except TimeoutError:
            break
    return events


def test_a_handoff_is_an_agent_span_of_its_own_in_the_runs_trace(workspace):
    with prx_hooks.Hooks(workspace=workspace) as hooks:
        sub = hooks.bus.subscribe("*")
        run_hooks = PrxRunHooks(hooks.emitter("coder", "oa-h"), hooks=hooks)
        assert run(handoff_agents(), run_hooks) == "All done."
        events = until_agent_end(sub, "oa-h")
        time.sleep(0.2)
        assert sub.try_recv() is None
    by_session = {}
    for m in events:
        assert m.agent == "coder"
        by_session.setdefault(m.session, []).append(m)
    assert list(by_session) == ["oa-h", "oa-h/reviewer"]
    coder, reviewer = by_session["oa-h"], by_session["oa-h/reviewer"]
    # One agent span per agent: each agent starts and ends once, on its own (agent, session).
    for mine in (coder, reviewer):
        kinds = [m.event for m in mine]
        assert kinds.count("agent_start") == kinds.count("agent_end") == 1
        assert kinds[0] == "agent_start" and kinds[-2:] == ["turn_complete", "agent_end"]
        assert mine[-1].payload["success"] is True
    assert [m.payload.get("agent_name") for m in (coder[0], reviewer[0])] == ["coder", "reviewer"]
    # The reviewer's events name the run's session: its span nests in the coder's trace,
    # under the coder's span, which ends after it.
    assert {m.payload.get("parent_session") for m in reviewer} == {"oa-h"}
    assert all("parent_session" not in m.payload for m in coder)
    assert reviewer[0].payload["handoff_from"] == "coder"
    assert events.index(reviewer[-1]) < events.index(coder[-1])
    assert [m.payload["tool"] for m in reviewer if m.event == "tool_call"] == ["read_file"]
    assert [m.payload["tool"] for m in coder if m.event == "tool_call"] == ["read_file"]
    assert coder[-1].payload["input_tokens"] == 40  # the run's four model calls


def test_two_concurrent_runs_that_both_hand_off_stay_in_sessions_of_their_own(workspace):
    with prx_hooks.Hooks(workspace=workspace) as hooks:
        sub = hooks.bus.subscribe("*")
        run_hooks = PrxRunHooks(hooks.emitter("coder", "oa-hc"), hooks=hooks)

        async def both():
            return await asyncio.gather(
                Runner.run(handoff_agents(0.02, "a.rs"), "one", hooks=run_hooks),
                Runner.run(handoff_agents(0.01, "b.rs"), "two", hooks=run_hooks))

        assert [r.final_output for r in asyncio.run(both())] == ["All done.", "All done."]
        events = []
        while [m.event for m in events].count("agent_end") < 4:
            try:
                events.append(sub.recv(timeout=10))
            except TimeoutError:
                break
        time.sleep(0.2)
        while (m := sub.try_recv()) is not None:
            events.append(m)
    sessions = {}
    for m in events:
        sessions.setdefault(m.session, []).append(m)
    # The runs did interleave: the second started before the first ended.
    kinds = [m.event for m in events]
    assert kinds.index("agent_end") > [i for i, k in enumerate(kinds) if k == "agent_start"][1]
    # Four agents, four sessions: each agent starts and ends once on its own (agent, session),
    # which is what keeps each run's spans apart.
    assert len(sessions) == 4, {s: [m.event for m in mine] for s, mine in sessions.items()}
    for session, mine in sessions.items():
        k = [m.event for m in mine]
        assert k.count("agent_start") == k.count("agent_end") == 1, (session, k)
        assert k[0] == "agent_start" and k[-1] == "agent_end", (session, k)
    # Each reviewer names its own run's coder: the one that read the same file.
    coders = [s for s, mine in sessions.items() if mine[0].payload["agent_name"] == "coder"]
    reviewers = [s for s in sessions if s not in coders]
    assert len(coders) == len(reviewers) == 2 and "oa-hc" in coders
    paths = {s: {m.payload["arguments"]["path"] for m in sessions[s]
                 if m.event == "tool_call_start"} for s in coders}
    assert sorted(map(sorted, paths.values())) == [["a.rs"], ["b.rs"]]
    parents = {sessions[r][0].payload["parent_session"] for r in reviewers}
    assert parents == set(coders)
    for r in reviewers:
        assert r.startswith(sessions[r][0].payload["parent_session"] + "/"), r


def test_concurrent_runs_in_one_sdk_trace_still_get_sessions_of_their_own(workspace):
    # Three runs inside one `trace(...)` block share the SDK's trace id: the second and third
    # cannot both be `<session>/<trace id>`.
    from agents import trace

    with prx_hooks.Hooks(workspace=workspace) as hooks:
        sub = hooks.bus.subscribe("*")
        run_hooks = PrxRunHooks(hooks.emitter("coder", "oa-t"), hooks=hooks)

        async def three():
            with trace("one workflow"):
                return await asyncio.gather(*(
                    Runner.run(handoff_agents(0.01 * (n + 1), f"{n}.rs"), str(n), hooks=run_hooks)
                    for n in range(3)))

        assert [r.final_output for r in asyncio.run(three())] == ["All done."] * 3
        events = []
        while [m.event for m in events].count("agent_end") < 6:
            try:
                events.append(sub.recv(timeout=10))
            except TimeoutError:
                break
    sessions = {}
    for m in events:
        sessions.setdefault(m.session, []).append(m.event)
    assert len(sessions) == 6, sessions
    for session, kinds in sessions.items():
        assert kinds.count("agent_start") == kinds.count("agent_end") == 1, (session, kinds)


def test_two_concurrent_runs_on_one_tracing_processor_stay_apart(workspace):
    with prx_hooks.Hooks(workspace=workspace) as hooks:
        sub = hooks.bus.subscribe("*")
        set_trace_processors([PrxTracingProcessor(hooks.emitter("coder", "oa-c"), hooks=hooks)])

        async def both():
            slow = Agent(name="coder", instructions="Fix it.", tools=[read_file],
                         model=FakeModel([("read_file", {"path": "a.rs"})] * 3, pause=0.02))
            fast = Agent(name="coder", instructions="Fix it.", tools=[read_file],
                         model=FakeModel([("read_file", {"path": "b.rs"})] * 3, pause=0.01))
            return await asyncio.gather(Runner.run(slow, "one"), Runner.run(fast, "two"))

        results = asyncio.run(both())
        assert [r.final_output for r in results] == ["All done.", "All done."]
        events = []
        while [m.event for m in events].count("agent_end") < 2:
            events.append(sub.recv(timeout=10))
    sessions = {}
    for m in events:
        sessions.setdefault(m.session, []).append(m)
    assert len(sessions) == 2, list(sessions)
    # The runs did interleave: the second started before the first ended.
    kinds = [m.event for m in events]
    assert kinds.index("agent_end") > [i for i, k in enumerate(kinds) if k == "agent_start"][1]
    for session, mine in sessions.items():
        trace_ids = {m.payload["trace_id"] for m in mine}
        assert len(trace_ids) == 1 and session == "oa-c/" + trace_ids.pop()
        k = [m.event for m in mine]
        assert k[0] == "agent_start" and k[-1] == "agent_end" and k.count("agent_start") == 1
        assert k.count("tool_call") == 3 and k.count("llm_response") == 4
        assert mine[-1].payload["success"] is True
    paths = {s: {m.payload["arguments"]["path"] for m in mine if m.event == "tool_call_start"}
             for s, mine in sessions.items()}
    assert sorted(map(sorted, paths.values())) == [["a.rs"], ["b.rs"]]


def test_the_provider_comes_from_the_model_and_tool_names_are_bounded(workspace):
    long_name = "ré" * 200  # 600 bytes

    @function_tool(name_override=long_name)
    def long_tool(path: str) -> str:
        """A tool with a long name."""
        return "ok"

    with prx_hooks.Hooks(workspace=workspace) as hooks:
        sub = hooks.bus.subscribe("*")
        set_trace_processors([PrxTracingProcessor(hooks.emitter("coder", "oa-p"))])
        a = Agent(name="coder", instructions="Fix it.", tools=[long_tool],
                  model=FakeModel([(long_name, {"path": "a.rs"})],
                                  name="anthropic/claude-sonnet-4"))
        run(a, PrxRunHooks(hooks.emitter("coder", "oa-p2")))
        events = until_agent_end(sub, "oa-p")
    processor = [m.payload for m in events if m.session == "oa-p"]
    assert {p["provider"] for p in processor if "provider" in p} == {"anthropic"}
    assert {p["model"] for p in processor if "provider" in p} == {"claude-sonnet-4"}
    names = [p["tool"] for p in (m.payload for m in events) if "tool" in p]
    assert len(names) == 4  # the run hooks' and the processor's start and end
    for name in names:
        assert len(name.encode()) <= 256 and long_name.startswith(name), name


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


def test_a_run_that_raises_leaves_its_session_free_for_the_next(workspace):
    # The SDK calls no run hook when a run raises (here: out of turns), so nothing ends the
    # run's hold on its session; once the SDK has dropped the run, the next run on the same
    # emitter is on the emitter's session again, not on one of its own.
    import gc

    from agents.exceptions import MaxTurnsExceeded

    from prx_hooks import openai_agents

    with prx_hooks.Hooks(workspace=workspace) as hooks:
        sub = hooks.bus.subscribe("prx.lifecycle.agent_start")
        run_hooks = PrxRunHooks(hooks.emitter("coder", "oa-raise"), hooks=hooks)
        with pytest.raises(MaxTurnsExceeded):
            asyncio.run(Runner.run(agent(), "go", hooks=run_hooks, max_turns=1))
        first = sub.recv(timeout=10)
        assert first.session == "oa-raise"
        gc.collect()
        assert ("coder", "oa-raise") not in openai_agents._OPEN_RUNS
        assert run_hooks._runs == {}
        assert run(agent(), hooks=run_hooks) == "All done."
        second = sub.recv(timeout=10)
        assert second.session == "oa-raise", second.session
    assert not openai_agents._OPEN_RUNS
