"""What the framework guards share: ask ``hooks.decide`` before a tool runs, and turn the
verdict into "run it" or "refuse, telling the model why"."""

from __future__ import annotations

import json
from typing import Any, Optional, Tuple

from ._native import Hooks, Verdict
from .errors import DecideError

__all__ = ["check_tool_call", "refusal_text"]

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
