"""prx-hooks for Python: lifecycle hooks for AI agents that never slow the agent down.

    import prx_hooks
    with prx_hooks.Hooks(workspace=".") as hooks:        # hooks.json, plugins/, the bus
        em = hooks.emitter("my-agent", "session-42")
        em.tool_call_start("shell", {"cmd": "ls"})        # "queued" | "dropped" | "skipped"

Events go into prx-hooks' lock-free ring; its Rust threads run the shell hooks of
``hooks.json``, the WASM plugins, the bus, the HTTP API (``listen=``) and the NATS bridge
(``nats=``, ``from_nats=``). Framework handlers: ``prx_hooks.langchain`` (LangChain,
LangGraph) and ``prx_hooks.openai_agents`` (the OpenAI Agents SDK). See docs/python.md.
"""

from __future__ import annotations

from . import _native
from ._native import (
    EVENTS,
    Bus,
    Emitter,
    Hooks,
    Message,
    NatsConsume,
    NatsPublish,
    Subscription,
    Verdict,
    __version__,
)
from .errors import (
    BuildError,
    BusError,
    ClosedError,
    DecideError,
    Error,
    ExtrasError,
    ForkError,
)

__all__ = [
    "EVENTS",
    "Bus",
    "BuildError",
    "BusError",
    "ClosedError",
    "DecideError",
    "Emitter",
    "Error",
    "ExtrasError",
    "ForkError",
    "Hooks",
    "Message",
    "NatsConsume",
    "NatsPublish",
    "Subscription",
    "Verdict",
    "__version__",
]


def _register_exit() -> None:
    # Every live Hooks shuts down at interpreter exit (draining for its shutdown_timeout).
    # threading's exit hooks run before non-daemon threads are joined: a thread iterating a
    # subscription then sees the bus close and ends, instead of keeping the exit waiting.
    import threading

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_native._shutdown_all)
            return
        except RuntimeError:  # the interpreter is already shutting down
            pass
    import atexit

    atexit.register(_native._shutdown_all)


_register_exit()
