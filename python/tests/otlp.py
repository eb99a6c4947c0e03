"""A real OTLP/HTTP receiver over loopback for the trace tests: http.server answering
`POST /v1/traces`, the protobuf `ExportTraceServiceRequest` decoded with the OpenTelemetry
project's own generated classes (opentelemetry-proto), each span flattened into a `Span`."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan, Status

KINDS = {
    ProtoSpan.SPAN_KIND_INTERNAL: "INTERNAL",
    ProtoSpan.SPAN_KIND_CLIENT: "CLIENT",
    ProtoSpan.SPAN_KIND_SERVER: "SERVER",
    ProtoSpan.SPAN_KIND_PRODUCER: "PRODUCER",
    ProtoSpan.SPAN_KIND_CONSUMER: "CONSUMER",
}


def _value(v):
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which)


@dataclass
class Span:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent: str  # "" for a root
    start: int  # ns since the epoch
    end: int
    attrs: Dict[str, object]
    events: List[str]
    error: bool
    status_message: str
    resource: Dict[str, object] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"<{self.name} {self.span_id[:6]}>"


class Receiver:
    """`with Receiver() as rx:` serves on a free loopback port; `rx.url` is what `--otlp` takes."""

    def __init__(self) -> None:
        self.spans: List[Span] = []
        self.requests = 0
        self.paths: List[str] = []
        self.content_types: List[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._take(self.path, self.headers.get("Content-Type", ""), request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "Receiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self, path: str, content_type: str, request: ExportTraceServiceRequest) -> None:
        got = []
        for rs in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(Span(
                        name=s.name,
                        kind=KINDS.get(s.kind, str(s.kind)),
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent=s.parent_span_id.hex(),
                        start=s.start_time_unix_nano,
                        end=s.end_time_unix_nano,
                        attrs={kv.key: _value(kv.value) for kv in s.attributes},
                        events=[e.name for e in s.events],
                        error=s.status.code == Status.STATUS_CODE_ERROR,
                        status_message=s.status.message,
                        resource=resource,
                    ))
        with self._lock:
            self.requests += 1
            self.paths.append(path)
            self.content_types.append(content_type)
            self.spans.extend(got)

    def snapshot(self) -> List[Span]:
        with self._lock:
            return list(self.spans)


def render(spans: List[Span]) -> str:
    """The spans as indented trees, one per trace (for failure messages)."""
    by_parent: Dict[str, List[Span]] = {}
    ids = {s.span_id for s in spans}
    for s in spans:
        by_parent.setdefault(s.parent if s.parent in ids else "", []).append(s)
    lines: List[str] = []

    def walk(s: Span, depth: int) -> None:
        flags = [s.kind] + (["error"] if s.error else [])
        lines.append(f"{'  ' * depth}{s.name} [{', '.join(flags)}] "
                     f"{(s.end - s.start) / 1e6:.1f} ms trace {s.trace_id[:8]}")
        for c in sorted(by_parent.get(s.span_id, []), key=lambda c: (c.start, c.name)):
            walk(c, depth + 1)

    for root in sorted(by_parent.get("", []), key=lambda s: (s.trace_id, s.start)):
        walk(root, 0)
    return "\n".join(lines)


def children(spans: List[Span], parent: Span, name: Optional[str] = None) -> List[Span]:
    return [s for s in spans if s.parent == parent.span_id and (name is None or s.name == name)]
