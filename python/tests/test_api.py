"""The API: emit outcomes, argument errors, extras, the bus, stats, options, shutdown."""

from __future__ import annotations

import json
import threading
import time

import pytest

import prx_hooks
from conftest import read_log, recorder_hook, wait_for, write_hooks


def test_emit_says_what_happened_to_the_event():
    with prx_hooks.Hooks(workspace=None, inline_bytes=16, max_event_bytes=64) as hooks:
        em = hooks.emitter("a", "s")
        assert em.tool_call("t", True, "x") == "skipped"  # nobody listens
        assert not em.is_listened("tool_call")
        sub = hooks.bus.subscribe("prx.lifecycle.tool_call")
        assert em.is_listened("tool_call") and not em.is_listened("error")
        assert em.tool_call("t", True, "x") == "queued"
        assert em.tool_call("t", True, "x" * 100) == "dropped"  # over max_event_bytes
        assert em.error("c", "m") == "skipped"
        assert sub.recv(timeout=10).payload == {"tool": "t", "success": True, "output": "x"}
        stats = hooks.stats()
        assert (stats["emitted"], stats["queued"], stats["oversize"], stats["skipped"]) == (4, 1, 1, 2)
    assert em.tool_call("t", True, "x") == "skipped"  # after shutdown


def test_arguments_of_the_wrong_type_are_type_errors_naming_them():
    with prx_hooks.Hooks(workspace=None) as hooks:
        sub = hooks.bus.subscribe("*")  # noqa: F841 (kept: a listener)
        em = hooks.emitter("a", "s")
        with pytest.raises(TypeError, match="^tool: expected str, got int$"):
            em.tool_call(1, True, "")
        with pytest.raises(TypeError, match="^success: expected bool, got str$"):
            em.tool_call("t", "yes", "")
        with pytest.raises(TypeError, match="^success: expected bool, got int$"):
            em.agent_end(1, 0)
        with pytest.raises(TypeError, match="^messages_count: expected int, got float$"):
            em.agent_end(True, 1.0)
        with pytest.raises(TypeError, match="^messages_count: expected int, got bool$"):
            em.llm_request("p", "m", True)
        with pytest.raises(ValueError, match="^duration_ms: expected an int from 0 to 2\\*\\*64 - 1, got -1$"):
            em.llm_response("p", "m", -1, True)
        with pytest.raises(TypeError, match="^arguments: expected a dict or JSON text \\(str\\), got list$"):
            em.tool_call_start("t", [1])
        with pytest.raises(TypeError, match="^message: str holds a lone surrogate"):
            em.error("c", "\udcff")
        with pytest.raises(TypeError, match="^extras: expected a dict or JSON text"):
            em.turn_complete(extras=[("a", 1)])
        with pytest.raises(TypeError):
            em.tool_call_start()  # missing tool
        with pytest.raises(TypeError):
            em.turn_complete(extra={})  # misspelt keyword
        with pytest.raises(ValueError, match='unknown event "tool_calls"'):
            em.is_listened("tool_calls")
        assert hooks.stats()["emitted"] == 0

        class Tool(str):
            pass

        assert em.tool_call(Tool("sub"), True, Tool("classes")) == "queued"


def test_refused_extras_raise_the_librarys_error_and_are_counted():
    with prx_hooks.Hooks(workspace=None) as hooks:
        sub = hooks.bus.subscribe("*")  # noqa: F841 (kept: a listener)
        em = hooks.emitter("a", "s")
        with pytest.raises(prx_hooks.ExtrasError) as e:
            em.tool_call("t", True, "o", extras={"tool": "again"})
        assert str(e.value) == 'extra fields, at byte 1: member "tool" repeats a documented field of tool_call'
        assert isinstance(e.value, ValueError) and isinstance(e.value, prx_hooks.Error)
        with pytest.raises(prx_hooks.ExtrasError, match="^extra fields, at byte 7: expected a string key$"):
            em.turn_complete(extras='{"a":1,}')
        with pytest.raises(prx_hooks.ExtrasError, match='member "a" appears twice'):
            em.turn_complete(extras='{"a":1,"a":2}')
        with pytest.raises(prx_hooks.ExtrasError, match='cannot omit "output": agent_end has no such field'):
            em.agent_end(True, 0, omit=["output"])
        stats = hooks.stats()
        assert (stats["refused_extras"], stats["emitted"]) == (4, 0)
        assert em.agent_end(True, 0, omit="messages_count") == "queued"


def test_a_subscription_is_iterable_with_a_timeout_and_ends_at_shutdown():
    hooks = prx_hooks.Hooks(workspace=None)
    em = hooks.emitter("a", "s")
    with hooks.bus.subscribe("prx.lifecycle.*", timeout=0.3) as idle:
        assert repr(idle).startswith('<prx_hooks.Subscription "prx.lifecycle.*"')
        for n in range(3):
            em.tool_call(f"t{n}", True, "")
        started = time.monotonic()
        got = [m.payload["tool"] for m in idle]  # ends 0.3 s after the last message
        assert got == ["t0", "t1", "t2"]
        assert 0.25 < time.monotonic() - started < 5
    assert idle.closed and len(idle) == 0
    with pytest.raises(prx_hooks.ClosedError, match="closed"):
        idle.recv(timeout=0)

    sub = hooks.bus.subscribe("prx.lifecycle.error")
    with pytest.raises(TimeoutError):
        sub.recv(timeout=0.05)
    assert sub.try_recv() is None
    seen = []
    reader = threading.Thread(target=lambda: seen.extend(m.seq for m in sub))
    reader.start()
    for _ in range(5):
        em.error("c", "m")
    wait_for("the reader to get 5 messages", lambda: len(seen) == 5)
    hooks.shutdown()
    reader.join(10)
    assert not reader.is_alive(), "iteration must end when the hooks shut down"
    assert seen == [3, 4, 5, 6, 7]  # seq counts every event of the emitter
    with pytest.raises(prx_hooks.ClosedError, match="shut down"):
        sub.recv()
    with pytest.raises(prx_hooks.ClosedError):
        sub = hooks.bus.subscribe("*")  # noqa: F841 (kept: a listener)


def test_messages_carry_the_events_metadata():
    with prx_hooks.Hooks(workspace=None) as hooks:
        sub = hooks.bus.subscribe("*", capacity=2)
        assert sub.capacity == 2 and sub.pattern == "*"
        em = hooks.emitter("my-agent", "session-42")
        before = time.time()
        em.tool_call_start("shell", {"cmd": "ls"})
        msg = sub.recv(timeout=10)
        assert msg.topic == "prx.lifecycle.tool_call_start" and msg.event == "tool_call_start"
        assert (msg.agent, msg.session, msg.seq, msg.depth) == ("my-agent", "session-42", 0, 0)
        assert before - 1 <= msg.timestamp <= time.time() + 1
        assert msg.timestamp_rfc3339.endswith("Z")
        envelope = json.loads(msg.envelope())
        assert envelope["payload"] == msg.payload == {"tool": "shell", "arguments": {"cmd": "ls"}}
        assert envelope["topic"] == msg.topic and envelope["seq"] == 0
        # A full queue loses only this subscription's messages, counted on it.
        for _ in range(4):
            em.turn_complete()
        wait_for("the worker to offer all four", lambda: sub.dropped + sub.delivered >= 5)
        assert (len(sub), sub.delivered, sub.dropped) == (2, 3, 2)
        assert hooks.bus.subscribers()[0]["dropped"] == 2


def test_custom_topics_are_published_to_matching_subscribers():
    with prx_hooks.Hooks(workspace=None) as hooks:
        bus = hooks.bus
        audit = bus.subscribe("myapp.audit.*")
        assert bus.publish("myapp.audit.done", {"ok": True, "n": [1, 2.5]}) == 1
        assert bus.publish("myapp.audit.done", '[1, {"a" : null}]') == 1
        assert bus.publish("other.topic", "{}") == 0
        first, second = audit.recv(timeout=5), audit.recv(timeout=5)
        assert (first.topic, first.json, first.event, first.agent) == (
            "myapp.audit.done", '{"ok":true,"n":[1,2.5]}', None, "")
        assert second.json == '[1,{"a":null}]'
        with pytest.raises(prx_hooks.BusError, match='reserved'):
            bus.publish("prx.lifecycle.tool_call", "{}")
        with pytest.raises(prx_hooks.BusError, match="not valid JSON"):
            bus.publish("myapp.x", "{nope")
        with pytest.raises(prx_hooks.BusError, match='invalid pattern "a..b"'):
            bus.subscribe("a..b")
        with pytest.raises(TypeError, match=r'payload\["s"\]: set'):
            bus.publish("myapp.x", {"s": set()})
    with pytest.raises(prx_hooks.ClosedError):
        bus.publish("myapp.x", "{}")


def test_options_are_the_builders_with_its_defaults_and_errors():
    with prx_hooks.Hooks(workspace=None) as hooks:
        ring = hooks.stats()["ring"]
        assert (ring["capacity"], ring["shards"], ring["inline_bytes"], ring["budget"]) == (
            65536, 1, 65536 * 256, 64 << 20)
    with prx_hooks.Hooks(workspace=None, ring_capacity=100, workers=2, inline_bytes=64) as hooks:
        ring = hooks.stats()["ring"]
        assert (ring["capacity"], ring["shards"], ring["inline_bytes"]) == (128, 2, 128 * 64)
    with pytest.raises(prx_hooks.BuildError, match="^workers = 0: must be between 1 and 64$"):
        prx_hooks.Hooks(workspace=None, workers=0)
    with pytest.raises(prx_hooks.BuildError, match="^workspace /nonexistent/ws: No such file"):
        prx_hooks.Hooks(workspace="/nonexistent/ws")
    with pytest.raises(ValueError, match="shutdown_timeout=-1"):
        prx_hooks.Hooks(workspace=None, shutdown_timeout=-1)
    with pytest.raises(ValueError, match="give listen= too"):
        prx_hooks.Hooks(workspace=None, token="x" * 32)
    with pytest.raises(prx_hooks.BuildError, match="NATS"):
        prx_hooks.Hooks(workspace=None, nats=prx_hooks.NatsPublish("nats://127.0.0.1:1", pattern="a..b"))


def test_stats_hold_every_counter_and_the_backends_sections(workspace):
    log = workspace / "calls.log"
    write_hooks(workspace, {"tool_call": [recorder_hook(log, id="rec")]})
    with prx_hooks.Hooks(workspace=workspace) as hooks:
        em = hooks.emitter("a", "s")
        for n in range(3):
            assert em.tool_call(f"t{n}", True, "") == "queued"
        wait_for("three hook runs", lambda: len(read_log(log)) == 3)
        stats = hooks.stats()
        assert (stats["config"]["actions"], stats["config"]["loaded"]) == (1, True)
        assert stats["shell"]["hooks"]["rec"]["ok"] == 3
        assert stats["emitted"] == stats["queued"] + stats["dropped"] + stats["dropped_budget"] + stats["oversize"] + stats["skipped"]
        assert list(stats)[:2] == ["emitted", "queued"]  # the library's order, as /api/stats
    assert [p["tool"] for _, p in read_log(log)] == ["t0", "t1", "t2"]


def test_shutdown_is_idempotent_and_keeps_its_deadline_with_a_hook_still_running(workspace):
    write_hooks(workspace, {"tool_call": [{"command": "/bin/sleep", "args": ["30"], "timeout_ms": 60000}]})
    hooks = prx_hooks.Hooks(workspace=workspace)
    em = hooks.emitter("a", "s")
    assert em.tool_call("t", True, "") == "queued"
    wait_for("the hook to run", lambda: hooks.stats()["shell"]["totals"]["running"] == 1)
    started = time.monotonic()
    hooks.shutdown(0.5)
    took = time.monotonic() - started
    assert took < 0.5 + 0.25 + 2.0, took  # timeout + SHUTDOWN_SLACK + scheduling on a busy machine
    assert hooks.is_shut_down and hooks.stats()["shell"]["totals"]["running"] == 0
    assert hooks.stats()["shell"]["totals"]["killed"] == 1
    hooks.shutdown()
    hooks.shutdown(0)
    assert em.tool_call("t", True, "") == "skipped"
    assert "(shut down)" in repr(hooks)


def test_reload_applies_an_edited_hooks_json_now(workspace):
    log = workspace / "calls.log"
    with prx_hooks.Hooks(workspace=workspace, reload_debounce=60) as hooks:
        write_hooks(workspace, {"error": [recorder_hook(log)]})
        assert hooks.reload() == "applied"  # at once, not a 60 s debounce later
        (workspace / "hooks.json").write_text("{ nope")
        assert hooks.reload() == "rejected"
        assert "hooks.json:1:3" in hooks.stats()["config"]["last_error"]
        hooks.emitter("a", "s").error("c", "after reload")  # the last good table runs it
        wait_for("the hook", lambda: read_log(log))
    assert prx_hooks.Hooks(workspace=None).reload() is None
