"""The OpenAI Agents SDK: run hooks and a tracing processor that emit prx-hooks' events.

Either (or both: they see different things) —

    from agents import Runner, add_trace_processor
    from prx_hooks.openai_agents import PrxRunHooks, PrxTracingProcessor

    em = hooks.emitter("my-agent", "session-42")
    await Runner.run(agent, "…", hooks=PrxRunHooks(em))      # one run's lifecycle
    add_trace_processor(PrxTracingProcessor(em))              # every traced run, errors too

| ``PrxRunHooks``                  | ``PrxTracingProcessor``            | event                      |
|----------------------------------|------------------------------------|----------------------------|
| ``on_agent_start``               | trace start                        | ``agent_start``            |
| ``on_llm_start``                 | generation / response span end     | ``llm_request``            |
| ``on_llm_end``                   | generation / response span end     | ``llm_response``           |
| ``on_tool_start``                | function span end                  | ``tool_call_start``        |
| ``on_tool_end``                  | function span end                  | ``tool_call``              |
| —                                | any span ending with an error      | ``error``                  |
| ``on_agent_end``                 | trace end                          | ``turn_complete``, ``agent_end`` |

``PrxRunHooks`` emits as things happen, with the tool's arguments as the model wrote them
(JSON text, passed on as is) and the call's id; the SDK tells run hooks nothing about
failures. The tracing processor sees every traced run of the process, failures included, but
emits a span's events when the span ends: the SDK fills in a span's data (a tool's
arguments, a model's input) after opening it. Extra fields carry the ids to correlate by
(``agent_name``, ``tool_call_id``, ``trace_id``, ``span_id``, ``parent_id``) and token counts
where the SDK reports them.

``prx_tool_guardrail(hooks, "my-agent")`` is a tool input guardrail asking prx-hooks'
policies before a function tool runs (``function_tool(..., tool_input_guardrails=[g])``, or
``guard_tools(tools, g)``): a ``deny`` (or an ``ask``: there is no one to ask) rejects the call
and the model gets the policy's reason instead of the tool's output; an ``allow`` or no
decision runs it.
"""

from __future__ import annotations

import copy
import time
from datetime import datetime
from typing import Any, Dict, Optional, Tuple

try:
    from agents import RunHooks, ToolGuardrailFunctionOutput, ToolInputGuardrail
    from agents.tracing import TracingProcessor
    from agents.tracing.span_data import (
        FunctionSpanData,
        GenerationSpanData,
        ResponseSpanData,
    )
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "prx_hooks.openai_agents needs the OpenAI Agents SDK: pip install openai-agents"
    ) from e

from ._guard import check_on_error, check_tool_call, record_refusal
from ._native import Emitter, Hooks

__all__ = ["PrxRunHooks", "PrxTracingProcessor", "guard_tools", "prx_tool_guardrail"]


def _model(model: Any) -> Tuple[str, str]:
    """(provider, model) of an agent's ``model``: a name, a Model object, or None."""
    if model is None:
        return "openai", "default"
    if isinstance(model, str):
        provider, _, rest = model.partition("/")
        return (provider, rest) if rest else ("openai", model)
    name = getattr(model, "model", None) or type(model).__name__
    module = type(model).__module__ or ""
    provider = "openai" if module.startswith("agents.models.openai") else type(model).__name__
    return str(provider), str(name)


def _usage(usage: Any) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        value = usage.get(key) if isinstance(usage, dict) else getattr(usage, key, None)
        if isinstance(value, int):
            out[key] = value
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


class PrxRunHooks(RunHooks):
    """``Runner.run(agent, input, hooks=PrxRunHooks(emitter))``. Safe to share between
    concurrent runs."""

    def __init__(self, emitter: Emitter) -> None:
        super().__init__()
        self.emitter = emitter
        # (id of the run's context, id of the agent) -> (provider, model, start in ns)
        self._llms: Dict[Tuple[int, int], Tuple[str, str, int]] = {}
        # (id of the context, tool call id or tool name) -> start in ns
        self._tools: Dict[Tuple[int, str], int] = {}
        self._runs: Dict[int, int] = {}

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        self._runs.setdefault(id(context), time.monotonic_ns())
        self.emitter.agent_start(extras={"agent_name": str(agent.name)})

    async def on_llm_start(
        self, context: Any, agent: Any, system_prompt: Optional[str], input_items: Any
    ) -> None:
        provider, model = _model(getattr(agent, "model", None))
        self._llms[(id(context), id(agent))] = (provider, model, time.monotonic_ns())
        count = len(input_items or ()) + (1 if system_prompt else 0)
        self.emitter.llm_request(provider, model, count, extras={"agent_name": str(agent.name)})

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        provider, model, start = self._llms.pop(
            (id(context), id(agent)), ("openai", "unknown", 0)
        )
        duration = (time.monotonic_ns() - start) // 1_000_000 if start else 0
        extras: Dict[str, Any] = {"agent_name": str(agent.name)}
        extras.update(_usage(getattr(response, "usage", None)))
        if getattr(response, "response_id", None):
            extras["response_id"] = str(response.response_id)
        self.emitter.llm_response(provider, model, duration, True, extras=extras)

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        call_id = getattr(context, "tool_call_id", None)
        self._tools[(id(context), str(call_id or tool.name))] = time.monotonic_ns()
        extras: Dict[str, Any] = {"agent_name": str(agent.name)}
        if call_id:
            extras["tool_call_id"] = str(call_id)
        arguments = getattr(context, "tool_arguments", None)
        self.emitter.tool_call_start(
            str(tool.name), arguments if isinstance(arguments, str) else None, extras=extras
        )

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        call_id = getattr(context, "tool_call_id", None)
        start = self._tools.pop((id(context), str(call_id or tool.name)), 0)
        extras: Dict[str, Any] = {"agent_name": str(agent.name)}
        if call_id:
            extras["tool_call_id"] = str(call_id)
        if start:
            extras["duration_ms"] = (time.monotonic_ns() - start) // 1_000_000
        self.emitter.tool_call(str(tool.name), True, _text(result), extras=extras)

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        start = self._runs.pop(id(context), 0)
        extras: Dict[str, Any] = {"agent_name": str(agent.name)}
        if start:
            extras["duration_ms"] = (time.monotonic_ns() - start) // 1_000_000
        extras.update(_usage(getattr(context, "usage", None)))
        self.emitter.turn_complete(extras={"agent_name": str(agent.name)})
        self.emitter.agent_end(True, 0, extras=extras)


def _ms(span: Any) -> int:
    try:
        start = datetime.fromisoformat(span.started_at)
        end = datetime.fromisoformat(span.ended_at)
        return max(0, int((end - start).total_seconds() * 1000))
    except (TypeError, ValueError):
        return 0


class PrxTracingProcessor(TracingProcessor):
    """``agents.add_trace_processor(PrxTracingProcessor(emitter))`` (keeps the SDK's own
    exporter) or ``agents.set_trace_processors([...])`` (replaces it). Every traced run of
    the process goes to ``emitter``."""

    def __init__(self, emitter: Emitter) -> None:
        self.emitter = emitter
        self._failed: Dict[str, bool] = {}  # trace id -> a span failed
        self._starts: Dict[str, int] = {}  # trace id -> start in ns

    def on_trace_start(self, trace: Any) -> None:
        self._failed[trace.trace_id] = False
        self._starts[trace.trace_id] = time.monotonic_ns()
        self.emitter.agent_start(
            extras={"trace_id": str(trace.trace_id), "workflow": str(trace.name)}
        )

    def on_trace_end(self, trace: Any) -> None:
        failed = self._failed.pop(trace.trace_id, False)
        start = self._starts.pop(trace.trace_id, 0)
        extras: Dict[str, Any] = {"trace_id": str(trace.trace_id)}
        self.emitter.turn_complete(extras=dict(extras))
        if start:
            extras["duration_ms"] = (time.monotonic_ns() - start) // 1_000_000
        self.emitter.agent_end(not failed, 0, extras=extras)

    def _ids(self, span: Any) -> Dict[str, Any]:
        ids = {"trace_id": str(span.trace_id), "span_id": str(span.span_id)}
        if span.parent_id:
            ids["parent_id"] = str(span.parent_id)
        return ids

    def on_span_start(self, span: Any) -> None:
        # The SDK fills a span's data in after opening it (a tool's arguments, a model's
        # input): each span's events are emitted when it ends, see on_span_end.
        pass

    def on_span_end(self, span: Any) -> None:
        data = span.span_data
        error = span.error
        if error:
            self._failed[span.trace_id] = True
        if isinstance(data, FunctionSpanData):
            arguments = data.input if isinstance(data.input, str) else None
            self.emitter.tool_call_start(str(data.name), arguments, extras=self._ids(span))
            if error:
                output = str(error.get("message"))
            else:
                output = _text(data.output if data.output is not None else "")
            self.emitter.tool_call(str(data.name), not error, output, extras=self._ids(span))
        elif isinstance(data, (GenerationSpanData, ResponseSpanData)):
            if isinstance(data, GenerationSpanData):
                model = str(data.model or "unknown")
                usage = _usage(data.usage)
            else:
                response = data.response
                model = str(getattr(response, "model", None) or "unknown")
                usage = _usage(getattr(response, "usage", None) or data.usage)
            items = data.input
            count = len(items) if isinstance(items, (list, tuple)) else int(bool(items))
            self.emitter.llm_request("openai", model, count, extras=self._ids(span))
            extras = self._ids(span)
            extras.update(usage)
            if error:
                extras["error_message"] = str(error.get("message"))
            self.emitter.llm_response("openai", model, _ms(span), not error, extras=extras)
        if error:
            self.emitter.error(
                str(getattr(data, "type", "span")), str(error.get("message")),
                extras=self._ids(span),
            )

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


def prx_tool_guardrail(
    hooks: Hooks,
    agent: Optional[str] = None,
    *,
    emitter: Optional[Emitter] = None,
    on_error: str = "none",
) -> ToolInputGuardrail:
    """A tool input guardrail asking ``hooks``' policies (``<workspace>/policies.json``) at
    ``tool_call_start`` with ``{"tool": <tool name>, "arguments": <the model's arguments>}``,
    as ``agent`` (default: the SDK agent's name). ``deny`` and ``ask`` reject the call: the
    tool does not run and the model gets the reason (``reject_content``); ``allow`` and no
    decision let it run. ``output_info`` holds the verdict (``Verdict.to_dict()``).
    ``on_error="deny"`` rejects a call the policies could not be asked about (default
    ``"none"``: it runs). With ``emitter=``, a rejected call is emitted as ``tool_call_start``
    with the decision as extra fields (``policy_decision``, ``policy_id``, ``policy_reason``),
    as run hooks never see it."""
    on_error = check_on_error(on_error)

    def prx_hooks_policies(data: Any) -> ToolGuardrailFunctionOutput:
        ctx = data.context
        name = agent if agent is not None else str(getattr(data.agent, "name", ""))
        text, verdict = check_tool_call(hooks, name, ctx.tool_name, ctx.tool_arguments, on_error)
        info = verdict.to_dict() if verdict is not None else None
        if text is None:
            return ToolGuardrailFunctionOutput.allow(output_info=info)
        if emitter is not None:
            record_refusal(
                emitter, ctx.tool_name, ctx.tool_arguments, ctx.tool_call_id, text, verdict
            )
        return ToolGuardrailFunctionOutput.reject_content(text, output_info=info)

    return ToolInputGuardrail(guardrail_function=prx_hooks_policies, name="prx_hooks_policies")


def guard_tools(tools: Any, guardrail: ToolInputGuardrail) -> list:
    """Copies of the function tools ``tools`` with ``guardrail`` first among their tool input
    guardrails (the tools given are left as they were)."""
    out = []
    for tool in tools:
        existing = list(getattr(tool, "tool_input_guardrails", None) or [])
        guarded = copy.copy(tool)
        guarded.tool_input_guardrails = [guardrail] + existing
        out.append(guarded)
    return out
