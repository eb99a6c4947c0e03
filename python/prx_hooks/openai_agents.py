"""The OpenAI Agents SDK: run hooks and a tracing processor that emit prx-hooks' events.

Either (or both: they see different things) —

    from agents import Runner, add_trace_processor
    from prx_hooks.openai_agents import PrxRunHooks, PrxTracingProcessor

    em = hooks.emitter("my-agent", "session-42")
    await Runner.run(agent, "…", hooks=PrxRunHooks(em, hooks=hooks))  # one run's lifecycle
    add_trace_processor(PrxTracingProcessor(em, hooks=hooks))          # every traced run

With ``hooks=``, an agent a run hands off to emits as an emitter of its own (session
``<run's session>/<agent name>``, events naming the handing agent's session in
``parent_session``), a run hooks' run that overlaps another on the same emitter is a session of
its own (``<session>/<trace id>``), and each traced run is a session of its own
(``<session>/<trace id>``): handoffs nest in the run's trace and concurrent runs stay apart.

| ``PrxRunHooks``                  | ``PrxTracingProcessor``            | event                      |
|----------------------------------|------------------------------------|----------------------------|
| ``on_agent_start``               | trace start                        | ``agent_start``            |
| ``on_llm_start``                 | generation / response span end     | ``llm_request``            |
| ``on_llm_end``                   | generation / response span end     | ``llm_response``           |
| ``on_tool_start``                | function span end                  | ``tool_call_start``        |
| ``on_tool_end``                  | function span end                  | ``tool_call``              |
| ``on_handoff``                   | —                                  | ``agent_start`` (next agent) |
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
import itertools
import threading
import time
import weakref
from datetime import datetime
from typing import Any, Dict, Optional, Tuple

try:
    from agents import RunHooks, ToolGuardrailFunctionOutput, ToolInputGuardrail
    from agents.tracing import TracingProcessor, get_current_trace
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


MAX_NAME_BYTES = 256
"""Tool names are cut to this many bytes (at a character's boundary): they become span names."""


def _name(name: Any) -> str:
    """A tool's name, bounded to ``MAX_NAME_BYTES`` UTF-8 bytes."""
    text = name if isinstance(name, str) else str(name)
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_NAME_BYTES:
        return text
    return raw[:MAX_NAME_BYTES].decode("utf-8", "ignore")


def _provider_of_name(name: str) -> Tuple[str, str]:
    """(provider, model) of a model name as the SDK's providers read it: ``litellm/<provider>/
    <model>`` and ``<provider>/<model>`` name their provider, a bare name is OpenAI's."""
    if name.startswith("litellm/"):
        name = name[len("litellm/"):]
    provider, _, rest = name.partition("/")
    return (provider, rest) if provider and rest else ("openai", name)


def _model(model: Any) -> Tuple[str, str]:
    """(provider, model) of an agent's ``model``: a name, a Model object, or None."""
    if model is None:
        return "openai", "default"
    if isinstance(model, str):
        return _provider_of_name(model)
    name = getattr(model, "model", None)
    module = type(model).__module__ or ""
    if module.startswith("agents.models.openai"):
        return "openai", str(name or type(model).__name__)
    if name is not None and "litellm" in module:
        # LitellmModel("anthropic/claude-…"): LiteLLM's provider prefix.
        return _provider_of_name(str(name))
    return type(model).__name__, str(name or type(model).__name__)


def _usage(usage: Any) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        value = usage.get(key) if isinstance(usage, dict) else getattr(usage, key, None)
        if isinstance(value, int):
            out[key] = value
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


class _Run:
    """One run's agents, the first one outermost: (emitter, agent name, start in ns, the
    session of the agent that handed over to it, or None for the first); the (agent, session)
    the run holds in ``_OPEN_RUNS``, if any."""

    __slots__ = ("agents", "handoffs", "held", "gone")

    def __init__(self) -> None:
        self.agents: list = []
        self.handoffs = 0
        self.held: Optional[Tuple[str, str]] = None
        # Forgets the run once the SDK drops its context (a run that raised: the SDK calls no
        # run hook then); detached when the run ends.
        self.gone: Optional[weakref.finalize] = None


def _forget(hooks_ref: "weakref.ref", key: int, run: _Run) -> None:
    """A run whose context the SDK dropped without ending it: its session is free again and
    its key (the id of an object now gone, which a later run's may reuse) is forgotten."""
    if run.held is not None:
        with _OPEN_LOCK:
            _OPEN_RUNS.discard(run.held)
        run.held = None
    hooks = hooks_ref()
    if hooks is not None and hooks._runs.get(key) is run:
        del hooks._runs[key]
        for k in [k for k in hooks._llms if k[0] == key]:
            hooks._llms.pop(k, None)
        for k in [k for k in hooks._tools if k[0] == key]:
            hooks._tools.pop(k, None)


# The (agent, session) of every run hooks' run in progress, whichever ``PrxRunHooks`` runs it:
# a run starting on a session another run holds takes a session of its own, or the two runs'
# events would pair as one agent's (an agent started twice, spans in each other's traces).
_OPEN_RUNS: set = set()
_OPEN_LOCK = threading.Lock()
_RUN_NUMBERS = itertools.count(1)


def _run_id() -> str:
    """The SDK's id of the run in progress (its trace's), else a number of this process."""
    trace = get_current_trace()
    tid = getattr(trace, "trace_id", None) if trace is not None else None
    if tid and tid != "no-op":
        return str(tid)
    return f"run-{next(_RUN_NUMBERS)}"


class PrxRunHooks(RunHooks):
    """``Runner.run(agent, input, hooks=PrxRunHooks(emitter, hooks=hooks))``. Safe to share
    between concurrent runs.

    A handoff keeps the run in one trace when ``hooks`` is given: the agent handed to emits
    as an emitter of its own (same agent, session ``<run's session>/<agent name>``) whose
    events name the handing agent's session (``parent_session``), so its ``invoke_agent`` span
    nests under the agent that handed off; every agent's span ends when the run does. Without
    ``hooks``, the handing agent ends (successfully, ``handoff_to`` naming the next one) and
    the next agent starts a trace of its own.

    Concurrent runs stay apart when ``hooks`` is given: a run is on ``emitter``'s session
    unless another run (of any ``PrxRunHooks``) is in progress on it; then it is on a session
    of its own, ``<session>/<trace id>`` (the SDK's trace of the run; ``-2``, ``-3``… after it
    for runs that share one ``trace(...)``). Without ``hooks`` every run is on ``emitter``'s
    session, and runs must not overlap."""

    def __init__(self, emitter: Emitter, *, hooks: Optional[Hooks] = None) -> None:
        super().__init__()
        self.emitter = emitter
        self.hooks = hooks
        # (id of the run's usage, id of the agent) -> (provider, model, start in ns)
        self._llms: Dict[Tuple[int, int], Tuple[str, str, int]] = {}
        # (id of the run's usage, tool call id or tool name) -> start in ns
        self._tools: Dict[Tuple[int, str], int] = {}
        self._runs: Dict[int, _Run] = {}

    @staticmethod
    def _run_key(context: Any) -> int:
        # A tool's context is a copy of the run's, sharing its usage counter.
        usage = getattr(context, "usage", None)
        return id(usage) if usage is not None else id(context)

    def _em(self, context: Any) -> Tuple[Emitter, Dict[str, Any]]:
        """The emitter of the run's current agent and the extras its events carry."""
        run = self._runs.get(self._run_key(context))
        if run is None or not run.agents:
            return self.emitter, {}
        em, _, _, parent = run.agents[-1]
        return em, ({"parent_session": parent} if parent is not None else {})

    def _hold(self, run: _Run) -> Emitter:
        """The emitter of a run's first agent: ``emitter``, or, when another run holds its
        session, an emitter on a session of the run's own."""
        if self.hooks is None:
            return self.emitter
        agent, session = self.emitter.agent, self.emitter.session
        with _OPEN_LOCK:
            if (agent, session) in _OPEN_RUNS:
                # Runs inside one `trace(...)` share its id: a number tells them apart.
                base = session = f"{session}/{_run_id()}"
                n = 1
                while (agent, session) in _OPEN_RUNS:
                    n += 1
                    session = f"{base}-{n}"
            run.held = (agent, session)
            _OPEN_RUNS.add(run.held)
        if session == self.emitter.session:
            return self.emitter
        return self.hooks.emitter(agent, session)

    def _run(self, context: Any) -> _Run:
        """The run of ``context``, registered on first sight."""
        key = self._run_key(context)
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = _Run()
            usage = getattr(context, "usage", None)
            if usage is not None:
                try:
                    run.gone = weakref.finalize(usage, _forget, weakref.ref(self), key, run)
                except TypeError:
                    pass  # not weakly referable: forgotten only when the run ends
        return run

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        run = self._run(context)
        if run.agents:
            return  # a handoff's target, started in on_handoff
        em = self._hold(run)
        run.agents.append((em, str(agent.name), time.monotonic_ns(), None))
        em.agent_start(extras={"agent_name": str(agent.name)})

    async def on_handoff(self, context: Any, from_agent: Any, to_agent: Any) -> None:
        run = self._run(context)
        name = str(to_agent.name)
        extras: Dict[str, Any] = {"agent_name": name, "handoff_from": str(from_agent.name)}
        if self.hooks is None:
            if run.agents:
                em, prev, start, _ = run.agents.pop()
                done: Dict[str, Any] = {"agent_name": prev, "handoff_to": name}
                done["duration_ms"] = (time.monotonic_ns() - start) // 1_000_000
                em.turn_complete(extras={"agent_name": prev})
                em.agent_end(True, 0, extras=done)
            run.agents.append((self.emitter, name, time.monotonic_ns(), None))
            self.emitter.agent_start(extras=extras)
            return
        parent = run.agents[-1][0].session if run.agents else self.emitter.session
        run.handoffs += 1
        root = run.agents[0][0].session if run.agents else self.emitter.session
        session = f"{root}/{name}"
        if any(a[0].session == session for a in run.agents):
            session = f"{session}-{run.handoffs}"
        em = self.hooks.emitter(self.emitter.agent, session)
        run.agents.append((em, name, time.monotonic_ns(), parent))
        extras["parent_session"] = parent
        em.agent_start(extras=extras)

    async def on_llm_start(
        self, context: Any, agent: Any, system_prompt: Optional[str], input_items: Any
    ) -> None:
        em, extras = self._em(context)
        provider, model = _model(getattr(agent, "model", None))
        self._llms[(self._run_key(context), id(agent))] = (provider, model, time.monotonic_ns())
        count = len(input_items or ()) + (1 if system_prompt else 0)
        extras["agent_name"] = str(agent.name)
        em.llm_request(provider, model, count, extras=extras)

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        em, extras = self._em(context)
        provider, model, start = self._llms.pop(
            (self._run_key(context), id(agent)), ("openai", "unknown", 0)
        )
        duration = (time.monotonic_ns() - start) // 1_000_000 if start else 0
        extras["agent_name"] = str(agent.name)
        extras.update(_usage(getattr(response, "usage", None)))
        if getattr(response, "response_id", None):
            extras["response_id"] = str(response.response_id)
        em.llm_response(provider, model, duration, True, extras=extras)

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        em, extras = self._em(context)
        call_id = getattr(context, "tool_call_id", None)
        name = _name(tool.name)
        self._tools[(self._run_key(context), str(call_id or name))] = time.monotonic_ns()
        extras["agent_name"] = str(agent.name)
        if call_id:
            extras["tool_call_id"] = str(call_id)
        arguments = getattr(context, "tool_arguments", None)
        # A call prx_tool_guardrail let run carries what it was decided (docs/policies.md § Audit).
        extras.update(_take_decision(context))
        em.tool_call_start(name, arguments if isinstance(arguments, str) else None, extras=extras)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        em, extras = self._em(context)
        call_id = getattr(context, "tool_call_id", None)
        name = _name(tool.name)
        start = self._tools.pop((self._run_key(context), str(call_id or name)), 0)
        extras["agent_name"] = str(agent.name)
        if call_id:
            extras["tool_call_id"] = str(call_id)
        if start:
            extras["duration_ms"] = (time.monotonic_ns() - start) // 1_000_000
        em.tool_call(name, True, _text(result), extras=extras)

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        run = self._runs.pop(self._run_key(context), None)
        agents = run.agents if run is not None else []
        if run is not None and run.gone is not None:
            run.gone.detach()
        if run is not None and run.held is not None:
            with _OPEN_LOCK:
                _OPEN_RUNS.discard(run.held)
            run.held = None
        if not agents:
            agents = [(self.emitter, str(agent.name), 0, None)]
        # The last agent first: each handed-off agent's span inside the one that handed off.
        for n, (em, name, start, parent) in enumerate(reversed(agents)):
            extras: Dict[str, Any] = {"agent_name": name}
            if parent is not None:
                extras["parent_session"] = parent
            if start:
                extras["duration_ms"] = (time.monotonic_ns() - start) // 1_000_000
            if parent is None:
                extras.update(_usage(getattr(context, "usage", None)))
            tc = {k: v for k, v in extras.items() if k in ("agent_name", "parent_session")}
            em.turn_complete(extras=tc)
            em.agent_end(True, 0, extras=extras)


def _ms(span: Any) -> int:
    try:
        start = datetime.fromisoformat(span.started_at)
        end = datetime.fromisoformat(span.ended_at)
        return max(0, int((end - start).total_seconds() * 1000))
    except (TypeError, ValueError):
        return 0


class PrxTracingProcessor(TracingProcessor):
    """``agents.add_trace_processor(PrxTracingProcessor(emitter, hooks=hooks))`` (keeps the
    SDK's own exporter) or ``agents.set_trace_processors([...])`` (replaces it). Every traced
    run of the process goes to ``emitter``'s agent.

    With ``hooks``, each run (each SDK trace) is a session of its own,
    ``<session>/<trace id>``, so concurrent runs stay apart; without it every run shares
    ``emitter``'s session, and runs must not overlap. A tool's failure is an ``error`` while
    its span is open and a failed ``tool_call``; the run fails only when the SDK marks
    something other than a tool failed (the model, a guardrail, the agent)."""

    def __init__(self, emitter: Emitter, *, hooks: Optional[Hooks] = None) -> None:
        self.emitter = emitter
        self.hooks = hooks
        # trace id -> [emitter, a span other than a tool's failed, start in ns]
        self._runs: Dict[str, list] = {}

    def _em(self, trace_id: str) -> Emitter:
        run = self._runs.get(trace_id)
        return run[0] if run is not None else self.emitter

    def on_trace_start(self, trace: Any) -> None:
        tid = str(trace.trace_id)
        if self.hooks is not None:
            em = self.hooks.emitter(self.emitter.agent, f"{self.emitter.session}/{tid}")
        else:
            em = self.emitter
        self._runs[tid] = [em, False, time.monotonic_ns()]
        em.agent_start(extras={"trace_id": tid, "workflow": str(trace.name)})

    def on_trace_end(self, trace: Any) -> None:
        tid = str(trace.trace_id)
        em, failed, start = self._runs.pop(tid, [self.emitter, False, 0])
        extras: Dict[str, Any] = {"trace_id": tid}
        em.turn_complete(extras=dict(extras))
        if start:
            extras["duration_ms"] = (time.monotonic_ns() - start) // 1_000_000
        em.agent_end(not failed, 0, extras=extras)

    def _ids(self, span: Any) -> Dict[str, Any]:
        ids = {"trace_id": str(span.trace_id), "span_id": str(span.span_id)}
        if span.parent_id:
            ids["parent_id"] = str(span.parent_id)
        return ids

    def on_span_start(self, span: Any) -> None:
        # The SDK fills a span's data in after opening it (a tool's arguments, a model's
        # input): each span's events are emitted when it ends, see on_span_end.
        pass

    def _error(self, em: Emitter, span: Any, data: Any, error: Any) -> None:
        em.error(
            str(getattr(data, "type", "span")), _text(error.get("message") or ""),
            extras=self._ids(span),
        )

    def on_span_end(self, span: Any) -> None:
        data = span.span_data
        error = span.error
        em = self._em(str(span.trace_id))
        if isinstance(data, FunctionSpanData):
            # A tool's failure is the model's to recover from: it does not fail the run.
            name = _name(data.name)
            arguments = data.input if isinstance(data.input, str) else None
            em.tool_call_start(name, arguments, extras=self._ids(span))
            if error:
                self._error(em, span, data, error)  # while the tool's span is open
                output = _text(error.get("message") or "")
            else:
                output = _text(data.output if data.output is not None else "")
            em.tool_call(name, not error, output, extras=self._ids(span))
            return
        if error and str(span.trace_id) in self._runs:
            self._runs[str(span.trace_id)][1] = True
        if isinstance(data, (GenerationSpanData, ResponseSpanData)):
            if isinstance(data, GenerationSpanData):
                provider, model = _provider_of_name(str(data.model or "unknown"))
                usage = _usage(data.usage)
            else:
                response = data.response
                provider = "openai"
                model = str(getattr(response, "model", None) or "unknown")
                usage = _usage(getattr(response, "usage", None) or data.usage)
            items = data.input
            count = len(items) if isinstance(items, (list, tuple)) else int(bool(items))
            em.llm_request(provider, model, count, extras=self._ids(span))
            extras = self._ids(span)
            extras.update(usage)
            if error:
                extras["error_message"] = _text(error.get("message") or "")
                self._error(em, span, data, error)
            em.llm_response(provider, model, _ms(span), not error, extras=extras)
        elif error:
            self._error(em, span, data, error)

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
    as run hooks never see it. A call let run on a decision (``allow``) carries the same fields
    on the ``tool_call_start`` that ``PrxRunHooks`` emits for it."""
    on_error = check_on_error(on_error)

    def prx_hooks_policies(data: Any) -> ToolGuardrailFunctionOutput:
        ctx = data.context
        name = agent if agent is not None else str(getattr(data.agent, "name", ""))
        text, verdict = check_tool_call(hooks, name, ctx.tool_name, ctx.tool_arguments, on_error)
        info = verdict.to_dict() if verdict is not None else None
        if text is None:
            _keep_decision(ctx, verdict)
            return ToolGuardrailFunctionOutput.allow(output_info=info)
        if emitter is not None:
            record_refusal(
                emitter, ctx.tool_name, ctx.tool_arguments, ctx.tool_call_id, text, verdict
            )
        return ToolGuardrailFunctionOutput.reject_content(text, output_info=info)

    return ToolInputGuardrail(guardrail_function=prx_hooks_policies, name="prx_hooks_policies")


# The attribute of the SDK's ToolContext (the object the guardrail and then the run hooks'
# `on_tool_start` are given for one call) holding the decision fields of a call let run.
_DECISION_ATTR = "_prx_hooks_decision"


def _keep_decision(ctx: Any, verdict: Any) -> None:
    if verdict is None or verdict.decision is None:
        return
    fields = {"policy_decision": verdict.decision}
    if verdict.policy:
        fields["policy_id"] = verdict.policy
    if verdict.reason:
        fields["policy_reason"] = verdict.reason
    try:
        setattr(ctx, _DECISION_ATTR, fields)
    except (AttributeError, TypeError):
        pass  # a context that takes no attribute: the start goes without the decision


def _take_decision(ctx: Any) -> Dict[str, str]:
    fields = getattr(ctx, _DECISION_ATTR, None)
    if fields is None:
        return {}
    try:
        delattr(ctx, _DECISION_ATTR)
    except (AttributeError, TypeError):
        pass
    return dict(fields)


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
