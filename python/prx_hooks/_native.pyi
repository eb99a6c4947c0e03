"""Type stubs of prx_hooks._native, the PyO3 extension (python/src/)."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Dict, Iterable, Iterator, List, Literal, Mapping, Optional, Union

Outcome = Literal["queued", "dropped", "skipped"]
JsonObject = Union[Mapping[str, Any], str]
Omit = Union[str, Iterable[str], None]
StrPath = Union[str, "os.PathLike[str]"]

EVENTS: List[str]
__version__: str

DecisionPoint = Literal["tool_call_start", "prompt", "permission"]

class Verdict:
    """What the policies answered; ``decision`` None when no policy decides."""

    @property
    def decision(self) -> Optional[Literal["allow", "ask", "deny"]]: ...
    @property
    def reason(self) -> Optional[str]: ...
    @property
    def policy(self) -> Optional[str]: ...
    @property
    def context(self) -> Optional[str]: ...
    @property
    def elapsed(self) -> float: ...
    @property
    def elapsed_us(self) -> int: ...
    @property
    def denied(self) -> bool: ...
    def to_dict(self) -> Dict[str, Any]: ...

class NatsPublish:
    def __init__(
        self,
        url: str,
        *,
        pattern: Optional[str] = None,
        prefix: Optional[str] = None,
        stream: Optional[str] = None,
        buffer: Optional[int] = None,
        window: Optional[int] = None,
        creds: Optional[StrPath] = None,
        tls: bool = False,
        tls_ca: Optional[StrPath] = None,
        tls_cert: Optional[StrPath] = None,
        tls_key: Optional[StrPath] = None,
    ) -> None: ...

class NatsConsume:
    def __init__(
        self,
        url: str,
        *,
        subject: Optional[str] = None,
        durable: Optional[str] = None,
        stream: Optional[str] = None,
        dedup_ids: int = 100_000,
        dedup_age: float = 3600.0,
        dedup_file: Optional[StrPath] = None,
        max_deliver: Optional[int] = None,
        lenient: bool = False,
        insecure: bool = False,
        creds: Optional[StrPath] = None,
        tls: bool = False,
        tls_ca: Optional[StrPath] = None,
        tls_cert: Optional[StrPath] = None,
        tls_key: Optional[StrPath] = None,
    ) -> None: ...

class Hooks:
    def __init__(
        self,
        workspace: Optional[StrPath] = ".",
        *,
        listen: Union[int, str, None] = None,
        token: Optional[str] = None,
        token_file: Optional[StrPath] = None,
        allow_hosts: List[str] = ...,
        nats: Union[str, NatsPublish, None] = None,
        from_nats: Union[str, NatsConsume, None] = None,
        ring_capacity: int = 65_536,
        workers: int = 1,
        inline_bytes: int = 256,
        byte_budget: int = 64 << 20,
        max_event_bytes: int = 4 << 20,
        subscriber_queue: int = 65_536,
        max_publish_bytes: int = 1 << 20,
        idle_tick: float = 0.001,
        shutdown_timeout: float = 2.0,
        reload_debounce: float = 0.05,
        max_running: int = 64,
        queue_per_hook: int = 256,
        run_history: int = 50,
        cgroup: Optional[StrPath] = None,
        detect_cgroup: bool = False,
        tmp_dir: Optional[StrPath] = None,
        harden: bool = False,
    ) -> None: ...
    def emitter(self, agent: str, session: str) -> Emitter: ...
    def decide(
        self,
        point: DecisionPoint,
        agent: str,
        payload: Optional[JsonObject] = None,
        *,
        within: Optional[float] = None,
    ) -> Verdict: ...
    @property
    def bus(self) -> Bus: ...
    def stats(self) -> Dict[str, Any]: ...
    def pending(self) -> int: ...
    def reload(self) -> Optional[Literal["applied", "unchanged", "rejected"]]: ...
    def shutdown(self, timeout: Optional[float] = None) -> None: ...
    def __enter__(self) -> Hooks: ...
    def __exit__(self, *exc: object) -> bool: ...
    @property
    def is_shut_down(self) -> bool: ...
    @property
    def workspace(self) -> Optional[pathlib.Path]: ...
    @property
    def api_address(self) -> Optional[str]: ...
    @property
    def api_token(self) -> Optional[str]: ...
    @property
    def api_token_source(self) -> Optional[str]: ...

class Emitter:
    @property
    def agent(self) -> str: ...
    @property
    def session(self) -> str: ...
    def is_listened(self, event: str) -> bool: ...
    def agent_start(
        self,
        agent: Optional[str] = None,
        session: Optional[str] = None,
        *,
        extras: Optional[JsonObject] = None,
        omit: Omit = None,
    ) -> Outcome: ...
    def agent_end(
        self, success: bool, messages_count: int, *, extras: Optional[JsonObject] = None, omit: Omit = None
    ) -> Outcome: ...
    def llm_request(
        self,
        provider: str,
        model: str,
        messages_count: int,
        *,
        extras: Optional[JsonObject] = None,
        omit: Omit = None,
    ) -> Outcome: ...
    def llm_response(
        self,
        provider: str,
        model: str,
        duration_ms: int,
        success: bool,
        *,
        extras: Optional[JsonObject] = None,
        omit: Omit = None,
    ) -> Outcome: ...
    def tool_call_start(
        self,
        tool: str,
        arguments: Optional[JsonObject] = None,
        *,
        extras: Optional[JsonObject] = None,
        omit: Omit = None,
    ) -> Outcome: ...
    def tool_call(
        self,
        tool: str,
        success: bool,
        output: Optional[str] = None,
        *,
        extras: Optional[JsonObject] = None,
        omit: Omit = None,
    ) -> Outcome: ...
    def turn_complete(self, *, extras: Optional[JsonObject] = None, omit: Omit = None) -> Outcome: ...
    def error(
        self, component: str, message: str, *, extras: Optional[JsonObject] = None, omit: Omit = None
    ) -> Outcome: ...

class Bus:
    def subscribe(
        self, pattern: str, *, capacity: Optional[int] = None, timeout: Optional[float] = None
    ) -> Subscription: ...
    def publish(self, topic: str, payload: Any) -> int: ...
    def subscribers(self) -> List[Dict[str, Any]]: ...
    @property
    def closed(self) -> bool: ...

class Subscription:
    def recv(self, timeout: Optional[float] = None) -> Message: ...
    def try_recv(self) -> Optional[Message]: ...
    def __iter__(self) -> Iterator[Message]: ...
    def __next__(self) -> Message: ...
    def close(self) -> None: ...
    def __enter__(self) -> Subscription: ...
    def __exit__(self, *exc: object) -> bool: ...
    def __len__(self) -> int: ...
    @property
    def pattern(self) -> str: ...
    @property
    def id(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def dropped(self) -> int: ...
    @property
    def delivered(self) -> int: ...
    @property
    def closed(self) -> bool: ...

class Message:
    @property
    def topic(self) -> str: ...
    @property
    def json(self) -> str: ...
    @property
    def payload(self) -> Any: ...
    @property
    def event(self) -> Optional[str]: ...
    @property
    def agent(self) -> str: ...
    @property
    def session(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def timestamp(self) -> float: ...
    @property
    def timestamp_rfc3339(self) -> str: ...
    @property
    def depth(self) -> int: ...
    def envelope(self) -> str: ...

def _shutdown_all() -> None: ...
