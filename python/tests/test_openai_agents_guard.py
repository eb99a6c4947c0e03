"""prx_tool_guardrail: a real OpenAI Agents SDK run (a scripted Model, no network) asks a real
policies.json before each function tool; a denied tool's body never runs and the model's next
turn holds the policy's reason instead of the tool's output."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("agents")

from agents import Agent, ModelResponse, Runner, Usage, function_tool, set_trace_processors
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import prx_hooks
from prx_hooks.openai_agents import PrxRunHooks, guard_tools, prx_tool_guardrail
from test_decide import POLICIES, write_policies

RAN: list = []


@function_tool
def shell(command: str) -> str:
    """Runs a shell command."""
    RAN.append(command)
    return f"ran {command}"


class ScriptedModel(Model):
    """One `shell` call per turn, then a message; keeps every input it was given."""

    def __init__(self, commands):
        self.inputs: list = []
        self.turns = [
            [ResponseFunctionToolCall(id=f"fc_{n}", call_id=f"call_{n}", type="function_call",
                                      name="shell", arguments=json.dumps({"command": c}))]
            for n, c in enumerate(commands)
        ] + [[ResponseOutputMessage(
            id="msg", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(text="Done.", type="output_text", annotations=[])])]]

    async def get_response(self, system_instructions, input, model_settings, tools,
                           output_schema, handoffs, tracing, *, previous_response_id=None,
                           conversation_id=None, prompt=None):
        self.inputs.append(input)
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the tests run without streaming")


@pytest.fixture(autouse=True)
def no_exporter():
    set_trace_processors([])  # the SDK's exporter would try to reach OpenAI
    yield
    set_trace_processors([])


@pytest.fixture
def hooks(tmp_path):
    write_policies(tmp_path, POLICIES)
    with prx_hooks.Hooks(workspace=tmp_path) as h:
        yield h


def tool_outputs(model):
    """The function call outputs the model was given, by call id (from its last input)."""
    return {
        item["call_id"]: item["output"]
        for item in model.inputs[-1]
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


COMMANDS = ["ls -l", "rm -rf /tmp/victim", "cargo build", "git push origin main"]


def test_the_guardrail_keeps_denied_tools_from_running_and_tells_the_model_why(hooks):
    RAN.clear()
    guardrail = prx_tool_guardrail(hooks)
    model = ScriptedModel(COMMANDS)
    agent = Agent(name="coder", model=model, tools=guard_tools([shell], guardrail))
    result = asyncio.run(Runner.run(agent, "clean up"))
    assert result.final_output == "Done."
    assert RAN == ["ls -l", "cargo build"]
    assert tool_outputs(model) == {
        "call_0": "ran ls -l",  # allow
        "call_1": "rm -rf is not allowed in this workspace",  # deny
        "call_2": "ran cargo build",  # no decision
        "call_3": "pushing needs a person",  # ask: no one to ask, rejected
    }
    # What was decided, for each call, as the SDK records its guardrails' results.
    infos = [r.output.output_info for r in result.tool_input_guardrail_results]
    assert [(i["decision"], i["policy"]) for i in infos] == [
        ("allow", "allow-ls"), ("deny", "no-rm-rf"), (None, None), ("ask", "ask-push")]
    p = hooks.stats()["policies"]
    assert (p["allow"], p["ask"], p["deny"], p["none"]) == (1, 1, 1, 1)


def test_the_policies_see_the_agent_name_given_or_the_sdk_agents(hooks, tmp_path):
    # A policy only for the agent "reviewer": the SDK agent's own name applies by default.
    write_policies(tmp_path, {"policies": [
        {"id": "reviewer-reads-only", "on": ["tool_call_start"], "agent": "reviewer",
         "matcher": "shell", "decision": "deny", "reason": "reviewers do not run commands"}]})
    hooks.reload()
    assert hooks.decide("tool_call_start", "reviewer", {"tool": "shell"}).decision == "deny"
    RAN.clear()
    model = ScriptedModel(["ls"])
    asyncio.run(Runner.run(Agent(name="reviewer", model=model,
                                 tools=guard_tools([shell], prx_tool_guardrail(hooks))), "go"))
    assert RAN == [] and tool_outputs(model) == {"call_0": "reviewers do not run commands"}
    model = ScriptedModel(["ls"])
    asyncio.run(Runner.run(Agent(name="reviewer", model=model,
                                 tools=guard_tools([shell], prx_tool_guardrail(hooks, "coder"))), "go"))
    assert RAN == ["ls"] and tool_outputs(model) == {"call_0": "ran ls"}


def test_with_an_emitter_a_rejected_call_is_emitted_with_its_decision(hooks):
    RAN.clear()
    sub = hooks.bus.subscribe("prx.lifecycle.tool_call_start")
    guardrail = prx_tool_guardrail(hooks, emitter=hooks.emitter("coder", "oa-audit"))
    model = ScriptedModel(["rm -rf /tmp/victim", "ls"])
    asyncio.run(Runner.run(Agent(name="coder", model=model, tools=guard_tools([shell], guardrail)), "go"))
    assert RAN == ["ls"]
    m = sub.recv(timeout=10)
    assert (m.event, m.agent, m.session) == ("tool_call_start", "coder", "oa-audit")
    assert m.payload == {
        "tool": "shell", "arguments": {"command": "rm -rf /tmp/victim"}, "tool_call_id": "call_0",
        "policy_decision": "deny", "policy_id": "no-rm-rf",
        "policy_reason": "rm -rf is not allowed in this workspace"}
    assert sub.try_recv() is None  # the allowed call: not the guardrail's to emit


def test_a_call_let_run_carries_its_decision_on_the_run_hooks_tool_call_start(hooks):
    RAN.clear()
    sub = hooks.bus.subscribe("prx.lifecycle.tool_call_start")
    guardrail = prx_tool_guardrail(hooks)
    model = ScriptedModel(["ls -l", "cargo build"])
    run_hooks = PrxRunHooks(hooks.emitter("coder", "oa-allowed"))
    agent = Agent(name="coder", model=model, tools=guard_tools([shell], guardrail))
    asyncio.run(Runner.run(agent, "go", hooks=run_hooks))
    assert RAN == ["ls -l", "cargo build"]
    first, second = sub.recv(timeout=10), sub.recv(timeout=10)
    assert first.payload["tool_call_id"] == "call_0"
    assert {k: v for k, v in first.payload.items() if k.startswith("policy_")} == {
        "policy_decision": "allow", "policy_id": "allow-ls", "policy_reason": "listing is fine"}
    # No policy decided `cargo build`: no decision fields.
    assert second.payload["tool_call_id"] == "call_1"
    assert not any(k.startswith("policy_") for k in second.payload), second.payload
