"""The process around the hooks: fork, interpreter exit, signals, Ctrl-C."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import prx_hooks
from conftest import read_log, recorder_hook, run_python, wait_for, write_hooks


def _child_uses_inherited_and_new(conn_w: int, workspace: str) -> None:
    """In a forked child: the inherited objects refuse with ForkError; a new Hooks works."""
    report = []
    try:
        INHERITED["em"].tool_call("t", True, "")
        report.append("inherited emitter worked?!")
    except prx_hooks.ForkError as e:
        report.append("ForkError" if "before os.fork()" in str(e) else f"bad message: {e}")
    for call in (lambda: INHERITED["hooks"].stats(), lambda: INHERITED["sub"].recv(timeout=0),
                 lambda: INHERITED["hooks"].bus.subscribe("*")):
        try:
            call()
            report.append("worked?!")
        except prx_hooks.ForkError:
            report.append("ForkError")
    with prx_hooks.Hooks(workspace=workspace) as fresh:
        sub = fresh.bus.subscribe("*")
        fresh.emitter("child", str(os.getpid())).tool_call("in-child", True, "")
        report.append(sub.recv(timeout=10).payload["tool"])
    os.write(conn_w, ("|".join(report) + "\n").encode())


INHERITED: dict = {}


@pytest.fixture
def inherited(workspace):
    log = workspace / "calls.log"
    write_hooks(workspace, {"tool_call": [recorder_hook(log)]})
    hooks = prx_hooks.Hooks(workspace=workspace)
    INHERITED.update(hooks=hooks, em=hooks.emitter("parent", "p"), sub=hooks.bus.subscribe("*"))
    yield workspace, log
    INHERITED.clear()
    hooks.shutdown()


def test_an_os_fork_child_gets_a_clear_error_and_can_make_its_own_hooks(inherited):
    workspace, log = inherited
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            _child_uses_inherited_and_new(w, str(workspace))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + 60
    while True:  # a hang in the child fails here, it does not hang the suite
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.05)
    report = os.read(r, 4096).decode().strip()
    os.close(r)
    assert os.WEXITSTATUS(status) == 0, report
    assert report == "ForkError|ForkError|ForkError|ForkError|in-child"
    # The parent's pipeline is untouched: its hook still runs.
    assert INHERITED["em"].tool_call("after-fork", True, "") == "queued"
    wait_for("the parent's hook", lambda: "after-fork" in [p["tool"] for _, p in read_log(log)])
    # and the child's own pipeline ran the same workspace's hook for its event
    assert "in-child" in [p["tool"] for _, p in read_log(log)]


def _pool_initializer(workspace: str) -> None:
    global POOL_HOOKS, POOL_SUB
    POOL_HOOKS = prx_hooks.Hooks(workspace=workspace)
    POOL_SUB = POOL_HOOKS.bus.subscribe("prx.lifecycle.tool_call")


def _pool_task(n: int) -> str:
    try:
        INHERITED["em"].tool_call("inherited", True, "")
        inherited = "worked?!"
    except prx_hooks.ForkError:
        inherited = "ForkError"
    em = POOL_HOOKS.emitter("worker", str(os.getpid()))
    outcome = em.tool_call(f"task-{n}", True, "")
    return f"{inherited}:{outcome}:{POOL_SUB.recv(timeout=20).payload['tool']}"


def test_multiprocessing_fork_workers_make_their_own_hooks_in_the_initializer(inherited):
    workspace, log = inherited
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2, initializer=_pool_initializer, initargs=(str(workspace),)) as pool:
        results = pool.map_async(_pool_task, range(6)).get(timeout=120)
    # Each worker's own pipeline delivered its events; the inherited one refused.
    assert results == [f"ForkError:queued:task-{n}" for n in range(6)]
    # (Pool's __exit__ terminates its workers with SIGTERM: what their pipelines still held
    # is lost with them. A worker that must drain calls POOL_HOOKS.shutdown() itself.)


def test_a_forked_child_that_exits_normally_does_not_hang(inherited):
    workspace, _ = inherited
    # A child that forgets about the inherited objects and exits through the interpreter's
    # normal exit (atexit, threading's exit hooks, module teardown).
    out = run_python(textwrap.dedent(f"""
        import os, sys, prx_hooks
        hooks = prx_hooks.Hooks(workspace={str(workspace)!r})
        em = hooks.emitter("a", "s")
        sub = hooks.bus.subscribe("*")
        pid = os.fork()
        if pid == 0:
            sys.exit(0)   # normal exit in the child: must not touch the parent's threads
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    """), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "child 0"


def test_the_interpreter_exits_with_a_thread_still_iterating_a_subscription(workspace):
    write_hooks(workspace, {"tool_call": [{"command": "/bin/sleep", "args": ["60"], "timeout_ms": 120000}]})
    started = time.monotonic()
    out = run_python(textwrap.dedent(f"""
        import threading, prx_hooks
        hooks = prx_hooks.Hooks(workspace={str(workspace)!r}, shutdown_timeout=1.0)
        sub = hooks.bus.subscribe("*")
        seen = []
        reader = threading.Thread(target=lambda: seen.extend(m.topic for m in sub))  # not a daemon
        reader.start()
        hooks.emitter("a", "s").tool_call("t", True, "")
        print("started", flush=True)
        # no shutdown(): the exit must do it, end the reader, and kill the sleeping hook
    """), timeout=60)
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "started"
    assert took < 30, f"exit took {took:.1f} s"
    leftover = subprocess.run(["pgrep", "-f", "^/bin/sleep 60$"], capture_output=True, text=True)
    assert leftover.stdout == "", "the hook's process outlived the interpreter"


def test_the_librarys_threads_leave_signals_to_python(workspace):
    """Every thread the library starts blocks the asynchronous signals, so Ctrl-C and SIGTERM
    reach a Python thread (and interrupt its blocking call) rather than a Rust thread."""
    write_hooks(workspace, {"tool_call": [recorder_hook(workspace / "log")]})
    with prx_hooks.Hooks(workspace=workspace, listen=0, workers=2) as hooks:
        hooks.emitter("a", "s").tool_call("t", True, "")
        wait_for("the hook", lambda: read_log(workspace / "log"))
        me = threading_ident_names()
        checked = 0
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/status") as f:
                    status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
            except FileNotFoundError:
                continue
            if int(task) in me:
                continue  # a Python thread
            blocked = int(status["SigBlk"].strip(), 16)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD):
                assert blocked & (1 << (sig - 1)), f"thread {status['Name'].strip()} takes {sig.name}"
            checked += 1
        assert checked >= 5  # workers, shell runner, watchers, HTTP runtime


def threading_ident_names():
    import threading

    return {t.native_id for t in threading.enumerate()}


@pytest.mark.parametrize("call", ["recv", "iterate", "shutdown"])
def test_ctrl_c_interrupts_a_blocking_call(workspace, call):
    write_hooks(workspace, {"tool_call": [{"command": "/bin/sleep", "args": ["60"], "timeout_ms": 120000}]})
    code = textwrap.dedent(f"""
        import signal, sys, time, prx_hooks
        # Python installs KeyboardInterrupt only where SIGINT was not ignored at start (a
        # background job of a shell without job control starts with it ignored).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        hooks = prx_hooks.Hooks(workspace={str(workspace)!r}, shutdown_timeout=30)
        sub = hooks.bus.subscribe("prx.lifecycle.error")
        hooks.emitter("a", "s").tool_call("t", True, "")
        while hooks.stats()["shell"]["totals"]["running"] == 0:
            time.sleep(0.01)
        print("ready", flush=True)
        started = time.monotonic()
        try:
            if {call!r} == "recv":
                sub.recv()
            elif {call!r} == "iterate":
                for _ in sub:
                    pass
            else:
                hooks.shutdown()   # 30 s: the sleeping hook would hold it that long
            print("returned", flush=True)
        except KeyboardInterrupt:
            print("interrupted %.2f" % (time.monotonic() - started), flush=True)
        hooks.shutdown(0)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert out.startswith("interrupted"), (out, err)
    assert float(out.split()[1]) < 10
    assert proc.returncode == 0, err
