"""Shared fixtures: workspaces with real hooks.json files, the prx-hooks binary, waiting."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]


def prx_hooks_binary() -> Path:
    """The CLI built from this repository (`cargo build --release`): the tests compare the
    Python package's payloads with what the Rust library writes for the same NDJSON input."""
    candidates = []
    if os.environ.get("PRX_HOOKS_BIN"):
        candidates.append(Path(os.environ["PRX_HOOKS_BIN"]))
    if os.environ.get("CARGO_TARGET_DIR"):
        candidates.append(Path(os.environ["CARGO_TARGET_DIR"]) / "release" / "prx-hooks")
    candidates.append(REPO / "target" / "release" / "prx-hooks")
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    pytest.fail(
        "the prx-hooks binary is missing (looked at "
        + ", ".join(str(c) for c in candidates)
        + "); build it with `cargo build --release` at the repository's root, or set PRX_HOOKS_BIN"
    )


def write_hooks(workspace: Path, hooks: dict) -> Path:
    path = workspace / "hooks.json"
    tmp = workspace / ".hooks.json.tmp"
    tmp.write_text(json.dumps({"hooks": hooks}))
    os.replace(tmp, path)
    return path


def wait_for(what: str, check: Callable[[], Optional[object]], timeout: float = 20.0):
    """Polls `check` until it returns something truthy; fails naming `what` after `timeout`
    (generous: the machine is shared with other builds)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def recorder_hook(log: Path, **extra) -> dict:
    """A shell hook appending `<seq> <payload>` lines to `log`, one run at a time (so the lines
    are in delivery order)."""
    hook = {
        "command": "/bin/sh",
        "args": ["-c", f'printf "%s %s\\n" "$ZERO_HOOK_SEQ" "$ZERO_HOOK_PAYLOAD" >> {log}'],
        "max_concurrent": 1,
        "timeout_ms": 10000,
    }
    hook.update(extra)
    return hook


def read_log(log: Path) -> list:
    if not log.exists():
        return []
    return [
        (int(seq), json.loads(payload))
        for seq, payload in (line.split(" ", 1) for line in log.read_text().splitlines())
    ]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory):
    """A real nats-server on a free loopback port (Debian's package)."""
    exe = shutil.which("nats-server") or "/usr/sbin/nats-server"
    if not os.access(exe, os.X_OK):
        pytest.fail("nats-server is missing: apt-get install nats-server")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = tmp_path_factory.mktemp("nats")
    proc = subprocess.Popen(
        [exe, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def up():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    wait_for("nats-server to listen", up)
    yield f"nats://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


def run_python(code: str, timeout: float = 60.0, env: Optional[dict] = None):
    """Runs `code` in a fresh interpreter (this one's), returning the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


class Server:
    """`prx-hooks run --workspace WS --listen 127.0.0.1:0 --otlp URL [ARGS]`, stopped with
    SIGTERM."""

    def __init__(self, ws: Path, otlp: str, *args: str) -> None:
        self.ws = ws
        env = {k: v for k, v in os.environ.items() if k != "PRX_HOOKS_TOKEN"}
        env["RUST_LOG"] = "info"
        self.proc = subprocess.Popen(
            [str(prx_hooks_binary()), "run", "--workspace", str(ws),
             "--listen", "127.0.0.1:0", "--otlp", otlp, *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: List[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.address = wait_for(
            "the server's address file",
            lambda: (ws / ".prx-hooks" / "address").is_file()
            and (ws / ".prx-hooks" / "address").read_text().strip())
        wait_for("the server to say it listens",
                 lambda: any("HTTP API on " in line for line in list(self.lines)))
        self.token = (ws / ".prx-hooks" / "token").read_text().strip()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def post_events(self, lines: List[str], at: str) -> dict:
        req = urllib.request.Request(
            self.address + "/api/events", method="POST", data="\n".join(lines).encode(),
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/x-ndjson",
                     "Prx-Timestamp": at})
        with urllib.request.urlopen(req, timeout=10) as resp:
            report = json.loads(resp.read())
        assert report["queued"] == len(lines) and not report["errors"], report
        return report

    def send_from(self, agent: str, payload: dict) -> None:
        send = prx_hooks_binary().with_name("prx-hooks-send")
        env = {k: v for k, v in os.environ.items() if k != "PRX_HOOKS_TOKEN"}
        out = subprocess.run(
            [str(send), "--from", agent, "--workspace", str(self.ws), "--strict"],
            input=json.dumps(payload), capture_output=True, text=True, timeout=30, env=env)
        assert out.returncode == 0 and out.stdout.strip() == "{}", (out.returncode, out.stdout,
                                                                   out.stderr)

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, "\n".join(self.lines)
        self._reader.join(10)
        for line in reversed(self.lines):
            try:
                return json.loads(line)
            except ValueError:
                continue
        pytest.fail("run printed no report:\n" + "\n".join(self.lines))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
