"""The process around the hooks: fork, interpreter exit, signals, Ctrl-C."""

from __future__ import annotations

import json
import multiprocessing
import os
import select
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


# A hooks.json the watcher refuses with 150 errors: each load logs 102 warnings (the first
# 100 errors, a line for the rest, the headline). A trailing space or none: every rewrite
# differs from the last, so every one is read and refused again.
def _refused_hooks_json(variant: int) -> str:
    return json.dumps({"hooks": {"tool_call": [{}] * 150}}) + " " * (variant % 2)


# The parent for the fork tests below, in an interpreter of its own (its stderr is the test's
# to choose). Its `Hooks` log without pause: their watchers refuse hooks.json files a thread
# rewrites every few milliseconds. It forks children one at a time; each makes its own `Hooks`
# on a refused hooks.json (its watcher logs while `Hooks(...)` builds), emits, receives its
# event and exits. A child that has not exited within `per_child` seconds is killed and
# counted as hung; the first hang ends the run.
_FORK_PARENT = r"""
import json, os, sys, threading, time, warnings
warnings.filterwarnings("ignore", category=DeprecationWarning)  # fork() with threads, 3.12+
import prx_hooks

p = json.loads(os.environ["PRX_TEST_FORK"])

def refused(variant):
    return json.dumps({"hooks": {"tool_call": [{}] * 150}}) + " " * (variant % 2)

def rewrite(ws, stop):
    i = 0
    while not stop.is_set():
        tmp = os.path.join(ws, ".hooks.json.tmp")
        with open(tmp, "w") as f:
            f.write(refused(i))
        os.replace(tmp, os.path.join(ws, "hooks.json"))
        i += 1
        time.sleep(0.003)  # past the watcher's 2 ms settle time: each rewrite is a reload

def child():
    if p.get("child_stderr"):
        fd = os.open(p["child_stderr"], os.O_WRONLY)
        os.dup2(fd, 2)
    with prx_hooks.Hooks(workspace=p["child_ws"]) as hooks:
        sub = hooks.bus.subscribe("prx.lifecycle.tool_call")
        hooks.emitter("child", str(os.getpid())).tool_call("in-child", True, "")
        assert sub.recv(timeout=20).payload["tool"] == "in-child"

if p.get("pipe_size"):
    import fcntl
    fcntl.fcntl(2, 1031, p["pipe_size"])  # F_SETPIPE_SZ
parents = [prx_hooks.Hooks(workspace=ws) for ws in p["parent_wss"]]
stop = threading.Event()
writers = [threading.Thread(target=rewrite, args=(ws, stop)) for ws in p["parent_wss"]]
for w in writers:
    w.start()
refusals = lambda: sum(h.stats()["config"]["reload_errors"] for h in parents)
if not p.get("wait_for_full_stderr"):
    while refusals() < 10 * len(parents):
        time.sleep(0.01)
else:
    # Until the parent's log fills the pipe its stderr is: a thread is then blocked inside a
    # write(2) to it, for good (nobody reads the pipe before this process reports).
    import fcntl, struct, termios
    size = fcntl.fcntl(2, 1032)  # F_GETPIPE_SZ
    queued = lambda: struct.unpack("i", fcntl.ioctl(2, termios.FIONREAD, b"\0\0\0\0"))[0]
    while queued() < size - 4096:
        time.sleep(0.01)
    time.sleep(0.2)

started = time.monotonic()
done, hung, failed = 0, [], []
while done < p["forks"] and time.monotonic() - started < p["budget"] and not hung:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + p["per_child"]
    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            if os.waitstatus_to_exitcode(status) != 0:
                failed.append((done, os.waitstatus_to_exitcode(status)))
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            hung.append(done)
            break
        time.sleep(0.002)
    done += 1
print(json.dumps({"forks": done, "hung": hung, "failed": failed,
                  "seconds": round(time.monotonic() - started, 1),
                  "parent_refusals": refusals()}), flush=True)
# Not through the exit's shutdown: a watcher may be blocked on a full stderr.
os._exit(0)
"""


def _fork_parent(tmp_path, *, parents: int, forks: int, budget: float, stderr, **extra):
    """Runs _FORK_PARENT; returns its report."""
    wss = []
    for name in [f"parent{i}" for i in range(parents)] + ["child"]:
        ws = tmp_path / name
        ws.mkdir()
        (ws / "hooks.json").write_text(_refused_hooks_json(0))
        wss.append(str(ws))
    params = {"parent_wss": wss[:-1], "child_ws": wss[-1], "forks": forks, "budget": budget,
              "per_child": 10.0, **extra}
    proc = subprocess.Popen([sys.executable, "-c", _FORK_PARENT], stdout=subprocess.PIPE,
                            stderr=stderr, env={**os.environ, "PRX_TEST_FORK": json.dumps(params)})
    try:
        # The report first, its stderr (when a pipe) only then: read earlier, the pipe would
        # never fill.
        ready, _, _ = select.select([proc.stdout], [], [], budget + 60)
        assert ready, "the parent did not report in time"
        report = proc.stdout.readline()
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and report, report
    return json.loads(report)


def test_forked_children_make_their_own_hooks_while_the_parent_logs_without_pause(tmp_path):
    """Forks while the parent's threads are writing log lines: a child must never find the
    log's means of writing held by a thread it does not have (docs/python.md § Processes,
    forks, signals). 300 forks (at most 45 s), each child logging from its own `Hooks`.

    The parent's stderr is a one-page pipe that `cat` drains, as when a log collector lags: a
    log line often waits for room inside its write, which widens the moment a fork can catch.
    While the log went through std's stderr lock (held across that write), about 1 fork in 20
    hung on it here (2 shared vCPUs), and 1 in 300 with stderr on /dev/null."""
    cat = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        r = _fork_parent(tmp_path, parents=2, forks=300, budget=45, stderr=cat.stdin,
                         pipe_size=4096)
    finally:
        cat.stdin.close()
        cat.wait(10)
    assert r["hung"] == [], f"child #{r['hung'][0]} of {r['forks']} hung in Hooks(...): {r}"
    assert r["failed"] == [], r
    assert r["forks"] >= 100, f"too few forks to mean anything: {r}"


def test_a_child_forked_while_a_parent_thread_is_stuck_writing_to_stderr_still_logs(tmp_path):
    """The same with a parent whose stderr is a pipe nobody reads: its logging thread is
    blocked inside a write to it when the child forks, every time. The child points its own
    stderr elsewhere and makes its `Hooks`, which log."""
    r = _fork_parent(tmp_path, parents=1, forks=1, budget=30, stderr=subprocess.PIPE,
                     wait_for_full_stderr=True, child_stderr=os.devnull)
    assert r["forks"] == 1 and r["hung"] == [] and r["failed"] == [], r


def test_the_interpreter_exits_with_a_thread_still_iterating_a_subscription(workspace):
    # A duration no other process on the machine sleeps for, so pgrep finds only this hook.
    naptime = "60.%06d" % (os.getpid() % 1000000)
    write_hooks(workspace, {"tool_call": [{"command": "/bin/sleep", "args": [naptime], "timeout_ms": 120000}]})
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
    leftover = subprocess.run(["pgrep", "-f", f"^/bin/sleep {naptime}$"], capture_output=True, text=True)
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
