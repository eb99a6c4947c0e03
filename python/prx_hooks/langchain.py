"""LangChain and LangGraph: a callback handler that emits prx-hooks' lifecycle events, and a
guard that asks prx-hooks' policies before a tool runs.

    from prx_hooks.langchain import PrxCallbackHandler
    handler = PrxCallbackHandler(hooks.emitter("my-agent", "session-42"))
    agent.invoke({"messages": [...]}, config={"callbacks": [handler]})

| LangChain callback                         | event                                       |
|--------------------------------------------|---------------------------------------------|
| root chain start (no parent run)           | ``agent_start``                             |
| chat model / LLM start                     | ``llm_request`` (provider, model, messages) |
| chat model / LLM end, error                | ``llm_response`` (duration, success)        |
| tool start                                 | ``tool_call_start`` (name, arguments)       |
| tool end, error                            | ``tool_call`` (success, output)             |
| any error (chain, LLM, tool)               | ``error`` (component, message)              |
| root chain end, error                      | ``turn_complete``, then ``agent_end``       |

Every event carries ``run_id`` (and ``parent_run_id`` when there is one) in its extra fields,
LangChain's ids, so that a hook can correlate a tool's start and end, or an LLM call with its
run; tool events carry ``tool_call_id`` when the model gave one, ``llm_response`` the token
counts when the model reported them. The handler runs inline (``run_inline``) and costs an
emit per callback: hooks run on prx-hooks' threads, never in the agent's.

``PrxToolGuard(hooks, "my-agent")`` asks ``hooks.decide`` before each tool call: as
LangGraph's ``ToolNode(tools, wrap_tool_call=guard, awrap_tool_call=guard.awrap)``, or around
tools themselves (``guard.tools([...])``) for anything that invokes LangChain tools. A ``deny``
(or an ``ask``: there is no one to ask) keeps the tool from running and gives the model a tool
message (status ``error``) with the policy's reason; an ``allow`` or no decision runs it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from typing import Any, Dict, Optional, Tuple
from uuid import UUID

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import BaseTool
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "prx_hooks.langchain needs langchain-core: pip install langchain-core"
    ) from e

from ._guard import check_on_error, check_tool_call, record_refusal
from ._native import Emitter, Hooks

__all__ = ["PrxCallbackHandler", "PrxToolGuard"]

# Decisions a guard keeps for its callback handler, at most.
_DECIDED_KEPT = 1024


def _ids(run_id: UUID, parent_run_id: Optional[UUID]) -> Dict[str, Any]:
    ids = {"run_id": str(run_id)}
    if parent_run_id is not None:
        ids["parent_run_id"] = str(parent_run_id)
    return ids


def _text(value: Any) -> str:
    """A tool's output as the text the model sees (a ToolMessage's content)."""
    content = getattr(value, "content", value)
    if isinstance(content, str):
        return content
    try:
        return json.dumps(content, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(content)


def _error(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class PrxCallbackHandler(BaseCallbackHandler):
    """Emits the lifecycle events of LangChain runs (chains, LangGraph graphs and prebuilt
    agents, chat models, tools) through ``emitter``. Thread-safe: LangGraph may run tools
    in parallel."""

    run_inline = True
    raise_error = False

    def __init__(
        self,
        emitter: Emitter,
        *,
        component: str = "langchain",
        guard: Optional["PrxToolGuard"] = None,
    ) -> None:
        super().__init__()
        self.emitter = emitter
        self.component = component
        # With a guard: a tool call it let run carries the decision it was given (if any).
        self.guard = guard
        # run id -> (provider, model, start in ns); tool run id -> (name, start in ns);
        # root run ids. Plain dicts: single operations on them are atomic under the GIL.
        self._llms: Dict[UUID, Tuple[str, str, int]] = {}
        self._tools: Dict[UUID, Tuple[str, int, Optional[str]]] = {}
        self._roots: Dict[UUID, int] = {}

    # -- runs -------------------------------------------------------------------------------

    def on_chain_start(
        self,
        serialized: Optional[Dict[str, Any]],
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        **kwargs: Any,
    ) -> None:
        if parent_run_id is not None:
            return
        self._roots[run_id] = time.monotonic_ns()
        name = kwargs.get("name") or (serialized or {}).get("name")
        extras = _ids(run_id, None)
        if name:
            extras["name"] = str(name)
        self.emitter.agent_start(extras=extras)

    def on_chain_end(
        self,
        outputs: Any,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        **kwargs: Any,
    ) -> None:
        self._end_root(run_id, True, outputs)

    def on_chain_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        **kwargs: Any,
    ) -> None:
        if run_id in self._roots:
            self.emitter.error(self.component, _error(error), extras=_ids(run_id, None))
        self._end_root(run_id, False, None)

    def _end_root(self, run_id: UUID, success: bool, outputs: Any) -> None:
        start = self._roots.pop(run_id, None)
        if start is None:
            return
        messages = outputs.get("messages") if isinstance(outputs, dict) else None
        count = len(messages) if isinstance(messages, (list, tuple)) else 0
        extras = {
            "run_id": str(run_id),
            "duration_ms": (time.monotonic_ns() - start) // 1_000_000,
        }
        self.emitter.turn_complete(extras={"run_id": extras["run_id"]})
        self.emitter.agent_end(success, count, extras=extras)

    # -- models -----------------------------------------------------------------------------

    def _llm_start(
        self,
        serialized: Optional[Dict[str, Any]],
        count: int,
        run_id: UUID,
        parent_run_id: Optional[UUID],
        metadata: Optional[Dict[str, Any]],
        kwargs: Dict[str, Any],
    ) -> None:
        meta = metadata or {}
        serialized = serialized or {}
        provider = str(meta.get("ls_provider") or serialized.get("name") or "unknown")
        params = kwargs.get("invocation_params") or {}
        model = str(
            meta.get("ls_model_name")
            or params.get("model")
            or params.get("model_name")
            or kwargs.get("name")
            or serialized.get("name")
            or "unknown"
        )
        self._llms[run_id] = (provider, model, time.monotonic_ns())
        self.emitter.llm_request(provider, model, count, extras=_ids(run_id, parent_run_id))

    def on_chat_model_start(
        self,
        serialized: Optional[Dict[str, Any]],
        messages: Any,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        metadata: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        count = sum(len(batch) for batch in messages) if messages else 0
        self._llm_start(serialized, count, run_id, parent_run_id, metadata, kwargs)

    def on_llm_start(
        self,
        serialized: Optional[Dict[str, Any]],
        prompts: Any,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        metadata: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        self._llm_start(serialized, len(prompts or ()), run_id, parent_run_id, metadata, kwargs)

    def _llm_end(
        self, run_id: UUID, parent_run_id: Optional[UUID], success: bool, extras: Dict[str, Any]
    ) -> None:
        provider, model, start = self._llms.pop(run_id, ("unknown", "unknown", 0))
        duration = (time.monotonic_ns() - start) // 1_000_000 if start else 0
        extras.update(_ids(run_id, parent_run_id))
        self.emitter.llm_response(provider, model, duration, success, extras=extras)

    def on_llm_end(
        self,
        response: Any,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        **kwargs: Any,
    ) -> None:
        extras: Dict[str, Any] = {}
        usage = _usage(response)
        if usage:
            extras.update(usage)
        self._llm_end(run_id, parent_run_id, True, extras)

    def on_llm_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        **kwargs: Any,
    ) -> None:
        message = _error(error)
        self._llm_end(run_id, parent_run_id, False, {"error_message": message})
        self.emitter.error("llm", message, extras=_ids(run_id, parent_run_id))

    # -- tools ------------------------------------------------------------------------------

    def on_tool_start(
        self,
        serialized: Optional[Dict[str, Any]],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        inputs: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        name = str((serialized or {}).get("name") or kwargs.get("name") or "tool")
        call_id = kwargs.get("tool_call_id")
        self._tools[run_id] = (name, time.monotonic_ns(), call_id)
        extras = _ids(run_id, parent_run_id)
        if call_id:
            extras["tool_call_id"] = str(call_id)
            if self.guard is not None:
                extras.update(self.guard.take_decision(str(call_id)))
        arguments: Any = inputs if isinstance(inputs, dict) else {"input": input_str}
        try:
            self.emitter.tool_call_start(name, arguments, extras=extras)
        except TypeError:
            # Inputs holding objects JSON has no form for (an injected state, a client):
            # their text instead, never a lost event.
            text = json.dumps(arguments, ensure_ascii=False, default=repr)
            self.emitter.tool_call_start(name, text, extras=extras)

    def _tool_end(
        self, run_id: UUID, parent_run_id: Optional[UUID], success: bool, output: str
    ) -> None:
        name, start, call_id = self._tools.pop(run_id, ("tool", 0, None))
        extras = _ids(run_id, parent_run_id)
        if call_id:
            extras["tool_call_id"] = str(call_id)
        if start:
            extras["duration_ms"] = (time.monotonic_ns() - start) // 1_000_000
        self.emitter.tool_call(name, success, output, extras=extras)

    def on_tool_end(
        self,
        output: Any,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        **kwargs: Any,
    ) -> None:
        status = getattr(output, "status", "success")
        self._tool_end(run_id, parent_run_id, status != "error", _text(output))

    def on_tool_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: Optional[UUID] = None,
        **kwargs: Any,
    ) -> None:
        message = _error(error)
        self._tool_end(run_id, parent_run_id, False, message)
        self.emitter.error("tool", message, extras=_ids(run_id, parent_run_id))


def _usage(response: Any) -> Dict[str, int]:
    """Token counts of an LLMResult: the messages' usage_metadata, else llm_output's."""
    total: Dict[str, int] = {}
    for batch in getattr(response, "generations", None) or ():
        for generation in batch:
            meta = getattr(getattr(generation, "message", None), "usage_metadata", None)
            if meta:
                for key in ("input_tokens", "output_tokens", "total_tokens"):
                    value = meta.get(key)
                    if isinstance(value, int):
                        total[key] = total.get(key, 0) + value
    if total:
        return total
    usage = (getattr(response, "llm_output", None) or {}).get("token_usage") or {}
    for key, ours in (
        ("prompt_tokens", "input_tokens"),
        ("completion_tokens", "output_tokens"),
        ("total_tokens", "total_tokens"),
    ):
        if isinstance(usage.get(key), int):
            total[ours] = usage[key]
    return total


class PrxToolGuard:
    """Asks ``hooks``' policies (``<workspace>/policies.json``) before a tool runs, as
    ``agent`` (the name policies' ``agent`` matchers see), at ``tool_call_start`` with the
    payload ``{"tool": <tool name>, "arguments": <the model's arguments>}``.

    - LangGraph: ``ToolNode(tools, wrap_tool_call=guard, awrap_tool_call=guard.awrap)``
      (``create_react_agent(model, that_node)``);
    - any LangChain runtime: ``guard.tools(tools)`` wraps each tool.

    ``deny`` and ``ask`` keep the tool from running: the model gets a ``ToolMessage`` with the
    reason and ``status="error"``. ``allow`` and no decision run it. ``on_error="deny"``
    refuses a call the policies could not be asked about (default ``"none"``: it runs, as
    ``on_error`` does in policies.json). With ``emitter=``, a refused call (which no callback
    sees: the tool never starts) is emitted as ``tool_call_start`` with the decision as extra
    fields (``policy_decision``, ``policy_id``, ``policy_reason``); a call it lets run gets
    them on the ``tool_call_start`` of ``PrxCallbackHandler(em, guard=guard)``."""

    def __init__(
        self,
        hooks: Hooks,
        agent: str,
        *,
        emitter: Optional[Emitter] = None,
        on_error: str = "none",
    ) -> None:
        self.hooks = hooks
        self.agent = agent
        self.emitter = emitter
        self.on_error = check_on_error(on_error)
        # Tool call id -> the decision fields of a call let run, until the callback handler
        # given this guard (``PrxCallbackHandler(em, guard=guard)``) emits its start. Bounded:
        # the oldest goes first.
        self._decided: "OrderedDict[str, Dict[str, str]]" = OrderedDict()
        self._lock = threading.Lock()

    def take_decision(self, call_id: str) -> Dict[str, str]:
        """The decision fields (``policy_decision``, ``policy_id``, ``policy_reason``) of the
        tool call ``call_id`` this guard let run, once; ``{}`` when no policy decided."""
        with self._lock:
            return self._decided.pop(call_id, {})

    def _keep_decision(self, call_id: Any, verdict: Any) -> None:
        if not call_id or verdict is None or verdict.decision is None:
            return
        fields = {"policy_decision": verdict.decision}
        if verdict.policy:
            fields["policy_id"] = verdict.policy
        if verdict.reason:
            fields["policy_reason"] = verdict.reason
        with self._lock:
            self._decided[str(call_id)] = fields
            while len(self._decided) > _DECIDED_KEPT:
                self._decided.popitem(last=False)

    def refusal(self, tool_call: Dict[str, Any]) -> Optional[ToolMessage]:
        """The message for the model when the policies refuse ``tool_call`` (a LangChain
        ``ToolCall``: ``name``, ``args``, ``id``), ``None`` when it may run."""
        name = str(tool_call.get("name", ""))
        args = tool_call.get("args")
        text, verdict = check_tool_call(self.hooks, self.agent, name, args, self.on_error)
        if text is None:
            self._keep_decision(tool_call.get("id"), verdict)
            return None
        if self.emitter is not None:
            record_refusal(self.emitter, name, args, tool_call.get("id"), text, verdict)
        return ToolMessage(
            content=text, tool_call_id=str(tool_call.get("id") or ""), name=name, status="error"
        )

    def __call__(self, request: Any, execute: Any) -> Any:
        """LangGraph's ``wrap_tool_call``: ``request.tool_call`` runs through ``execute`` only
        when the policies let it."""
        refused = self.refusal(request.tool_call)
        return refused if refused is not None else execute(request)

    async def awrap(self, request: Any, execute: Any) -> Any:
        """LangGraph's ``awrap_tool_call``."""
        refused = self.refusal(request.tool_call)
        return refused if refused is not None else await execute(request)

    def tool(self, tool: BaseTool) -> BaseTool:
        """``tool`` behind this guard: same name, description and arguments."""
        return _GuardedTool(tool, self)

    def tools(self, tools: Any) -> list:
        """Each of ``tools`` behind this guard."""
        return [self.tool(t) for t in tools]


class _GuardedTool(BaseTool):
    """A tool asking a ``PrxToolGuard`` before its inner tool is invoked."""

    inner: BaseTool
    guard: Any

    def __init__(self, inner: BaseTool, guard: PrxToolGuard) -> None:
        super().__init__(
            name=inner.name,
            description=inner.description,
            args_schema=inner.args_schema,
            return_direct=inner.return_direct,
            response_format=inner.response_format,
            inner=inner,
            guard=guard,
        )

    def _refused(self, tool_input: Any) -> Any:
        if isinstance(tool_input, dict) and tool_input.get("type") == "tool_call":
            return self.guard.refusal(tool_input)
        call = {"name": self.name, "args": tool_input, "id": None}
        refused = self.guard.refusal(call)
        return None if refused is None else refused.content

    def invoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        refused = self._refused(input)
        return refused if refused is not None else self.inner.invoke(input, config, **kwargs)

    async def ainvoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        refused = self._refused(input)
        if refused is not None:
            return refused
        return await self.inner.ainvoke(input, config, **kwargs)

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - invoke is overridden
        raise NotImplementedError("a guarded tool runs through invoke()")
