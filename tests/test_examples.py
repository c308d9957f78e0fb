"""Every example runs and prints what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import WAIT_S

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(name: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=WAIT_S,
                          check=True)
    return done.stdout


def test_the_kv_server_survives_a_crash_with_fresh_state() -> None:
    assert run("kv_server.py").splitlines() == ["stored", "Lisbon", "(not set)", "restarts: 1"]


def test_the_process_server_is_killed_at_its_deadline_and_restarted_fresh() -> None:
    assert run("process_server.py").splitlines() == [
        "stored", "Lisbon",
        "[timeout] server 'kv' did not answer slow() within 500 ms: its process was killed, so everything it held "
        "is lost; it is restarted with fresh state",
        "old process gone: True", "(not set)", "restarts: 1 isolation: process",
    ]


def test_the_fastapi_demo_serves_two_users_at_once_and_stops() -> None:
    assert run("fastapi_app.py").splitlines() == [
        "ann ['noted', '42', '[\"buy milk\"]']", "bob ['noted', '42', '[\"call mum\"]']",
        "shut down: 2 sessions stopped", "server stopped",
    ]


def test_the_fastapi_app_keeps_one_session_per_user_and_shuts_down_cleanly(tmp_path: Path) -> None:
    import asyncio
    import signal
    import socket

    import httpx

    from tests.conftest import wait_for

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, str(EXAMPLES / "fastapi_app.py"), "--port", str(port),
                               "--data-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/sessions/probe/tools", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        assert wait_for(up), "the server did not come up"
        tools = httpx.get(f"{base}/sessions/probe/tools", timeout=WAIT_S).json()
        assert [t["function"]["name"] for t in tools] == ["add", "note", "notes"]

        async def user(client: httpx.AsyncClient, name: str) -> list[dict[str, object]]:
            turn = {"calls": [{"id": "n", "name": "note", "arguments": {"text": f"{name}'s note"}},
                              {"id": "bad", "name": "add", "arguments": {"a": "x", "b": 1}}]}
            await client.post(f"/sessions/{name}/calls", json=turn)
            read = {"calls": [{"id": "r", "name": "notes", "arguments": {}}]}
            url = f"/sessions/{name}/calls"
            results: list[dict[str, object]] = (await client.post(url, json=read)).json()["results"]
            bad: list[dict[str, object]] = (await client.post(url, json=turn)).json()["results"]
            return results + bad[1:]

        async def users() -> list[list[dict[str, object]]]:
            async with httpx.AsyncClient(base_url=base, timeout=WAIT_S) as client:
                return list(await asyncio.gather(*(user(client, f"u{i}") for i in range(4))))

        for i, got in enumerate(asyncio.run(users())):
            assert got[0]["content"] == f'["u{i}\'s note"]'  # each user sees only their own session
            assert got[1]["error_kind"] == "invalid_arguments" and '$.a: "x"' in str(got[1]["content"])
        refused = httpx.post(f"{base}/sessions/..%2Fescape/calls", json={"calls": []}, timeout=WAIT_S)
        assert refused.status_code in (400, 404)
        assert httpx.delete(f"{base}/sessions/u0", timeout=WAIT_S).json() == {"stopped": True}
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=WAIT_S)
    assert server.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it shut down on
    assert out.decode().splitlines() == ["shut down: 4 sessions stopped"]  # probe and u1-u3 (u0 was stopped)
    assert (tmp_path / "sessions" / "u3" / "notes.txt").read_text() == "u3's note\nu3's note\n"
