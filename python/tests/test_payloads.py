"""Payload bytes: every event kind from Python equals what the Rust library writes for the same
input (through `prx-hooks run --events … --print`), and dicts are written as `json.dumps`
writes them."""

from __future__ import annotations

import json
import math
import random
import struct
import subprocess

import pytest

import prx_hooks

from conftest import prx_hooks_binary

AGENT, SESSION = "coder", "s-1"

NESTED = {
    "cmd": "ls -la",
    "env": {"A": 'é\n\t"\\\u0001\u001f\u007f', "B": "😀 \u2028"},
    "n": [1, -2.5, 1e16, 1e15, 1e-7, 0.1, 10**30, -(2**63), 2**64, True, False, None],
    "t": (1, "two", [3.0]),
    "": {},
    "deep": [[[[{"x": []}]]]],
}

# (method, args, kwargs, the NDJSON payload carrying the same input)
CASES = [
    ("agent_start", (), {}, {}),
    ("agent_start", (), {"extras": {"provider": "openai", "model": "gpt-4o"}},
     {"provider": "openai", "model": "gpt-4o"}),
    ("agent_start", ("other", "s-2"), {}, {"agent": "other", "session": "s-2"}),
    ("agent_end", (True, 3), {}, {"success": True, "messages_count": 3}),
    ("agent_end", (False, 0), {"extras": {"duration_ms": 5230, "tokens_used": 17}},
     {"success": False, "messages_count": 0, "duration_ms": 5230, "tokens_used": 17}),
    ("agent_end", (True, 0), {"extras": '{"duration_ms": 1}', "omit": ["messages_count"]},
     {"success": True, "duration_ms": 1}),
    ("llm_request", ("openai", "gpt-4o", 12), {}, {"provider": "openai", "model": "gpt-4o", "messages_count": 12}),
    ("llm_response", ("anthropic", "claude", 1234, False), {"extras": {"error_message": "rate limited"}},
     {"provider": "anthropic", "model": "claude", "duration_ms": 1234, "success": False,
      "error_message": "rate limited"}),
    ("tool_call_start", ("shell", NESTED), {}, {"tool": "shell", "arguments": NESTED}),
    ("tool_call_start", ("read_file", '{"path" :  "src/lib.rs",\n "lines": [1, 2]}'), {},
     {"tool": "read_file", "arguments": {"path": "src/lib.rs", "lines": [1, 2]}}),
    ("tool_call_start", ("mcp__fs__list", {}), {"extras": {"run_id": "r-1", "parent_run_id": None}},
     {"tool": "mcp__fs__list", "arguments": {}, "run_id": "r-1", "parent_run_id": None}),
    ("tool_call", ("shell", False, "exit 1\nstderr: \u00e9\x00"), {},
     {"tool": "shell", "success": False, "output": "exit 1\nstderr: \u00e9\x00"}),
    ("tool_call", ("shell", True), {"extras": {"duration_ms": 3}},
     {"tool": "shell", "success": True, "output": "", "duration_ms": 3}),
    ("turn_complete", (), {}, None),
    ("turn_complete", (), {"extras": {"mode": "chat", "response_chars": 118}},
     {"mode": "chat", "response_chars": 118}),
    ("error", ("tool", 'shell exited with status 101: "boom"'), {},
     {"component": "tool", "message": 'shell exited with status 101: "boom"'}),
]

EVENT = {
    "agent_start": "agent_start", "agent_end": "agent_end", "llm_request": "llm_request",
    "llm_response": "llm_response", "tool_call_start": "tool_call_start", "tool_call": "tool_call",
    "turn_complete": "turn_complete", "error": "error",
}


def rust_payloads(tmp_path, lines):
    """Payload bytes `prx-hooks run --print` writes for these NDJSON lines, in order."""
    events = tmp_path / "events.ndjson"
    events.write_text("".join(json.dumps(l, ensure_ascii=False) + "\n" for l in lines))
    ws = tmp_path / "empty-ws"
    ws.mkdir()
    out = subprocess.run(
        [str(prx_hooks_binary()), "run", "--workspace", str(ws), "--events", str(events),
         "--print", "--lenient", "-q"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    payloads = []
    for line in out.stdout.split("\n")[:-1]:  # not splitlines(): payloads may hold U+2028
        # The envelope's last member is the payload, written byte for byte.
        at = line.index(',"payload":')
        payloads.append(line[at + len(',"payload":'):-1])
    return payloads


def test_every_event_kind_equals_the_rust_librarys_bytes(tmp_path):
    lines = []
    for method, _, _, payload in CASES:
        line = {"event": EVENT[method], "agent": AGENT, "session": SESSION}
        if payload is not None:
            line["payload"] = payload
        lines.append(line)
    want = rust_payloads(tmp_path, lines)
    assert len(want) == len(CASES)

    with prx_hooks.Hooks(workspace=None) as hooks:
        sub = hooks.bus.subscribe("*")
        em = hooks.emitter(AGENT, SESSION)
        for method, args, kwargs, _ in CASES:
            assert getattr(em, method)(*args, **kwargs) == "queued", method
        got = [sub.recv(timeout=10) for _ in CASES]
    assert [m.event for m in got] == [EVENT[c[0]] for c in CASES]
    for (method, *_), msg, rust in zip(CASES, got, want):
        assert msg.json == rust, method
    assert [m.seq for m in got] == list(range(len(CASES)))
    assert {(m.agent, m.session) for m in got} == {(AGENT, SESSION)}


def emitted_arguments(value):
    with prx_hooks.Hooks(workspace=None) as hooks:
        sub = hooks.bus.subscribe("prx.lifecycle.tool_call_start")
        assert hooks.emitter("a", "s").tool_call_start("t", {"v": value}) == "queued"
        text = sub.recv(timeout=10).json
    prefix, suffix = '{"tool":"t","arguments":{"v":', "}}"
    assert text.startswith(prefix) and text.endswith(suffix), text
    return text[len(prefix):-len(suffix)]


def dumps(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def test_floats_are_spelled_as_python_spells_them():
    rng = random.Random(7)
    floats = [0.0, -0.0, 1.0, -1.5, 1e16, 1e15, 9999999999999998.0, 1e-4, 1e-5, 5e-324,
              1.7976931348623157e308, 2.2250738585072014e-308, 0.1 + 0.2, 123456789.123456789,
              1e22, 1e21, 1.5e-7, 100.0, 12345678901234567890.0]
    while len(floats) < 3000:
        f = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if math.isfinite(f):
            floats.append(f)
    floats += [rng.uniform(-1e6, 1e6) for _ in range(1000)]
    assert emitted_arguments(floats) == dumps(floats)


def test_strings_and_ints_are_written_as_json_dumps_writes_them():
    every_char = "".join(chr(c) for c in range(0x20 * 4)) + "é€😀\u2028\u2029\ufeff\U0010ffff"
    ints = [0, -1, 2**63 - 1, -(2**63), 2**63, 2**64 + 1, -(10**40), 10**100]

    class Color(int):
        def __str__(self):
            return "not a number"

    class Name(str):
        pass

    values = [every_char, ints, [Color(3)], Name("subclass"), {"k\n\"": Name("v")}]
    assert emitted_arguments(values) == dumps(values)


def test_text_that_is_not_a_json_object_becomes_a_string_as_in_rust():
    with prx_hooks.Hooks(workspace=None) as hooks:
        sub = hooks.bus.subscribe("*")
        em = hooks.emitter("a", "s")
        for text in ["not json", "[1, 2]", '{"unclosed": ', '"quoted"']:
            em.tool_call_start("t", text)
            assert sub.recv(timeout=10).payload == {"tool": "t", "arguments": text}


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"files": [1, 2, {3}]}, 'arguments["files"][2]: set is not JSON serializable'),
        ({"b": b"x"}, 'arguments["b"]: bytes is not JSON serializable'),
        ({"o": object()}, 'arguments["o"]: object is not JSON serializable'),
        ({"x": [float("nan")]}, 'arguments["x"][0]: float nan is not valid JSON'),
        ({"x": float("inf")}, 'arguments["x"]: float inf is not valid JSON'),
        ({"x": -math.inf}, 'arguments["x"]: float -inf is not valid JSON'),
        ({"a": {1: "one"}}, 'arguments["a"]: key 1 (int) is not a str'),
        ({"a": {None: 1}}, 'arguments["a"]: key None (NoneType) is not a str'),
        ({"s": "\ud800"}, 'arguments["s"]: str holds a lone surrogate'),
        ({"\udfff": 1}, "arguments: a key holds a lone surrogate"),
        ({"q\"": {1.5: 0}}, 'arguments["q\\""]: key 1.5 (float) is not a str'),
    ],
)
def test_values_json_cannot_hold_are_a_type_error_naming_the_path(arguments, message):
    with prx_hooks.Hooks(workspace=None) as hooks:
        sub = hooks.bus.subscribe("*")  # noqa: F841 (kept: a listener)
        em = hooks.emitter("a", "s")
        with pytest.raises(TypeError) as e:
            em.tool_call_start("t", arguments)
        assert str(e.value).startswith(message), str(e.value)
        with pytest.raises(TypeError) as e:
            em.turn_complete(extras={"wrapped": arguments})
        assert str(e.value).startswith(message.replace("arguments", 'extras["wrapped"]', 1))
        assert hooks.stats()["emitted"] == 0


def test_cycles_and_depth_are_refused_at_the_librarys_limits():
    with prx_hooks.Hooks(workspace=None) as hooks:
        sub = hooks.bus.subscribe("*")
        em = hooks.emitter("a", "s")
        loop = {"a": [1]}
        loop["a"].append(loop)
        with pytest.raises(TypeError, match=r'arguments\["a"\]\[1\]: dict contains itself'):
            em.tool_call_start("t", loop)
        lst = []
        lst.append(lst)
        with pytest.raises(TypeError, match=r'arguments\["l"\]\[0\]: list contains itself'):
            em.tool_call_start("t", {"l": lst})
        shared = [1]
        assert em.tool_call_start("t", {"x": shared, "y": shared}) == "queued"  # not a cycle
        sub.recv(timeout=10)

        def nested(levels):
            v = {}
            for _ in range(levels - 1):
                v = {"k": v}
            return v

        # ARGUMENTS_MAX_DEPTH (125): the arguments object itself is level 1.
        assert em.tool_call_start("t", nested(125)) == "queued"
        assert sub.recv(timeout=10).payload["arguments"] == nested(125)
        with pytest.raises(TypeError, match="nested more than 125 levels deep"):
            em.tool_call_start("t", nested(126))
        # EXTRAS_MAX_DEPTH (126)
        assert em.turn_complete(extras=nested(126)) == "queued"
        with pytest.raises(TypeError, match="nested more than 126 levels deep"):
            em.turn_complete(extras=nested(127))
