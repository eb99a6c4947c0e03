"""What the framework guards share: ask ``hooks.decide`` before a tool runs, and turn the
verdict into "run it" or "refuse, telling the model why"."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Tuple

from ._native import Hooks, Verdict
from .errors import DecideError

__all__ = ["check_tool_call", "refusal_text", "record_refusal"]

ON_ERROR = ("none", "deny")


def check_on_error(on_error: str) -> str:
    if on_error not in ON_ERROR:
        raise ValueError(f'on_error={on_error!r}: expected "none" or "deny"')
    return on_error


def refusal_text(v: Verdict) -> str:
    """What the model is told when a policy refuses: the policy's reason, or its id."""
    if v.reason:
        return v.reason
    return f"denied by policy {v.policy}" if v.policy else "denied by policy"


def check_tool_call(
    hooks: Hooks, agent: str, tool: str, arguments: Any, on_error: str
) -> Tuple[Optional[str], Optional[Verdict]]:
    """Asks the policies whether ``tool`` may run with ``arguments`` (a dict, or the JSON text
    of an object as models write it). Returns ``(refusal, verdict)``: ``refusal`` is the text
    for the model when the tool must not run (``deny``; ``ask`` too, frameworks having no one
    to ask), ``None`` when it runs (``allow``, or no decision). Arguments that are not JSON
    are asked about as text (conditions on ``arguments.…`` do not match them). A question the
    policies refuse (a payload over the limit, counted by them; a value JSON cannot hold)
    decides nothing unless ``on_error="deny"``."""
    if isinstance(arguments, (bytes, bytearray)):
        arguments = arguments.decode("utf-8", "replace")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            pass  # kept as text: conditions on `arguments.…` do not match it
    try:
        v = hooks.decide("tool_call_start", agent, {"tool": tool, "arguments": arguments})
    except (DecideError, TypeError, ValueError) as e:
        error = str(e)
    else:
        if v.decision in ("deny", "ask"):
            return refusal_text(v), v
        return None, v
    if on_error == "deny":
        return f"the policies could not decide ({error}): denied", None
    return None, None


def record_refusal(
    emitter: Any,
    tool: str,
    arguments: Any,
    call_id: Optional[str],
    text: str,
    verdict: Optional[Verdict],
) -> None:
    """Emits the refused call as the lifecycle events an agent's door would: its
    ``tool_call_start`` with the decision as extra fields (``policy_decision``, ``policy_id``,
    ``policy_reason``: docs/policies.md § Audit), so that hooks, the bus and the trace see it.
    A ``deny`` ends the call there (its span ends at the decision); an ``ask`` refused for want
    of someone to ask is followed by a failed ``tool_call`` with the reason."""
    decision = verdict.decision if verdict is not None and verdict.decision else "deny"
    extras: Dict[str, Any] = {}
    if call_id:
        extras["tool_call_id"] = str(call_id)
    extras["policy_decision"] = decision
    if verdict is not None and verdict.policy:
        extras["policy_id"] = verdict.policy
    extras["policy_reason"] = text
    if isinstance(arguments, (bytes, bytearray)):
        arguments = arguments.decode("utf-8", "replace")
    if not isinstance(arguments, (dict, str)):
        arguments = json.dumps(arguments, ensure_ascii=False, default=repr)
    try:
        emitter.tool_call_start(tool, arguments, extras=extras)
    except TypeError:
        text_args = json.dumps(arguments, ensure_ascii=False, default=repr)
        emitter.tool_call_start(tool, text_args, extras=extras)
    if decision != "deny":
        end = {"tool_call_id": str(call_id)} if call_id else None
        emitter.tool_call(tool, False, text, extras=end)
