"""`listen=` serves the HTTP API; `nats=` / `from_nats=` bridge through a real nats-server."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request

import pytest

import prx_hooks
from conftest import read_log, recorder_hook, wait_for, write_hooks


def request(hooks, path, method="GET", body=None, token=True):
    req = urllib.request.Request(hooks.api_address + path, method=method, data=body)
    if token:
        req.add_header("Authorization", f"Bearer {hooks.api_token}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_listen_serves_the_api_with_a_generated_token(workspace):
    log = workspace / "calls.log"
    with prx_hooks.Hooks(workspace=workspace, listen=0) as hooks:
        assert hooks.api_address.startswith("http://127.0.0.1:")
        assert len(hooks.api_token) == 64
        assert "generated into" in hooks.api_token_source
        token_file = workspace / ".prx-hooks" / "token"
        assert token_file.read_text().strip() == hooks.api_token
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        address_file = workspace / ".prx-hooks" / "address"
        assert address_file.read_text().strip() == hooks.api_address

        assert request(hooks, "/healthz", token=False)[0] == 200
        assert request(hooks, "/api/stats", token=False)[0] == 401
        # A hook created through the API is live before the response: the next emit runs it.
        hook = recorder_hook(log, id="via-api", event="tool_call")
        status, body = request(hooks, "/api/hooks", "POST", json.dumps(hook).encode())
        assert status == 201, body
        assert hooks.emitter("a", "s").tool_call("made-by-api", True, "") == "queued"
        wait_for("the API-made hook", lambda: read_log(log))
        status, body = request(hooks, "/api/stats")
        assert status == 200 and json.loads(body)["emitted"] == 1
    assert not address_file.exists(), "the address file is removed at shutdown"


def test_listen_takes_the_clis_addresses_and_an_explicit_token(workspace, tmp_path):
    token = "t0k3n-" + "x" * 20
    with prx_hooks.Hooks(workspace=None, listen="127.0.0.1:0", token=token) as hooks:
        assert hooks.api_token == token and hooks.api_token_source == "API token given as token="
        assert request(hooks, "/api/stats")[0] == 200
    sock = tmp_path / "api.sock"
    with prx_hooks.Hooks(workspace=workspace, listen=f"unix:{sock}") as hooks:
        assert hooks.api_address == f"unix:{sock}"
        assert oct(sock.stat().st_mode & 0o777) == "0o600"
    assert not sock.exists()
    with pytest.raises(prx_hooks.BuildError, match="needs token= or token_file="):
        prx_hooks.Hooks(workspace=None, listen=0)
    with pytest.raises(prx_hooks.BuildError, match="use at least 16"):
        prx_hooks.Hooks(workspace=None, listen=0, token="short")
    with pytest.raises(ValueError, match='listen="nowhere": expected IP:PORT'):
        prx_hooks.Hooks(workspace=None, listen="nowhere", token=token)
    with prx_hooks.Hooks(workspace=None, listen=0, token=token) as taken:
        port = int(taken.api_address.rsplit(":", 1)[1])
        with pytest.raises(prx_hooks.BuildError, match=f"listen=http://127.0.0.1:{port}: .*in use"):
            prx_hooks.Hooks(workspace=None, listen=port, token=token)


def test_nats_carries_events_to_another_process_that_runs_its_hooks(nats_server, tmp_path):
    """Agent host (this process) → nats-server → central host (a child) running hooks.json."""
    central = tmp_path / "central"
    central.mkdir()
    log = central / "calls.log"
    write_hooks(central, {"tool_call_start": [recorder_hook(log)]})
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, prx_hooks
            hooks = prx_hooks.Hooks(workspace={str(central)!r},
                                    from_nats=prx_hooks.NatsConsume({nats_server!r}))
            sub = hooks.bus.subscribe("prx.lifecycle.tool_call_start")
            print("ready", flush=True)
            for n in range(3):
                msg = sub.recv(timeout=60)
                print(msg.agent, msg.session, msg.json, flush=True)
            hooks.shutdown(5)
        """)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        with prx_hooks.Hooks(workspace=None, nats=nats_server) as hooks:
            em = hooks.emitter("fleet-agent", "s-9")
            for n in range(3):
                assert em.tool_call_start("shell", {"n": n}) == "queued"
            wait_for("the publisher to send", lambda: hooks.stats()["nats"]["publish"]["published"] >= 3)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0, err
    assert out.splitlines() == [
        f'fleet-agent s-9 {{"tool":"shell","arguments":{{"n":{n}}}}}' for n in range(3)
    ]
    assert [p["arguments"]["n"] for _, p in read_log(log)] == [0, 1, 2]
