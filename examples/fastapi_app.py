"""A web server running tool calls for many users at once, one rho session each (the
``fastapi`` extra: ``pip install 'rho_actors[fastapi]'``).

    POST /sessions/{session_id}/calls   {"calls": [{"id": "c1", "name": "add", "arguments": {"a": 1, "b": 2}}]}
                                        -> {"results": [{"call_id": "c1", "ok": true, "content": "3", ...}]}
    GET  /sessions/{session_id}/tools   -> the tools offered, in OpenAI's format
    DELETE /sessions/{session_id}       -> stops the session (its folder stays; it resumes on next use)

Each session is got or created by id on first use; the server stops every session and
the actor system when it shuts down (SIGINT/SIGTERM to uvicorn).

Run ``python examples/fastapi_app.py --port 8000`` to serve on 127.0.0.1, or with no
arguments for a demonstration: it serves on a free loopback port, two users call it at
once over HTTP, and it prints what they got.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from rho_actors import ActorSystem, Loop, ToolCall, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def note(text: str, ctx: Mapping[str, Any]) -> str:
    """Remember ``text`` in this session."""
    with open(Path(ctx["data_dir"]) / "notes.txt", "a", encoding="utf-8") as f:
        f.write(text + "\n")
    return "noted"


@tool
def notes(ctx: Mapping[str, Any]) -> list[str]:
    """What this session was asked to remember."""
    path = Path(ctx["data_dir"]) / "notes.txt"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


class Call(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class Turn(BaseModel):
    calls: list[Call]


class Sessions:
    """The running loops by session id, got or created on first use."""

    def __init__(self, system: ActorSystem) -> None:
        self.system = system
        self._loops: dict[str, Loop] = {}
        self._lock = threading.Lock()

    def get(self, session_id: str) -> Loop:
        with self._lock:
            loop = self._loops.get(session_id)
            if loop is None or not loop.alive:
                try:
                    loop = self.system.start_loop(session_id)
                except ValueError as exc:  # a session id rho refuses
                    raise HTTPException(400, str(exc)) from None
                self._loops[session_id] = loop
            return loop

    def running(self) -> list[str]:
        """The ids of the sessions running now."""
        with self._lock:
            return [sid for sid, loop in self._loops.items() if loop.alive]

    def stop(self, session_id: str) -> bool:
        with self._lock:
            loop = self._loops.pop(session_id, None)
        if loop is not None:
            loop.stop()
        return loop is not None


def make_app(data_dir: str | None = None) -> FastAPI:
    """The app; its lifespan starts the actor system and stops it (every session too)."""
    state: dict[str, Sessions] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        system = ActorSystem(data_dir=data_dir)
        for t in (add, note, notes):
            system.register(t)
        state["sessions"] = sessions = Sessions(system)
        try:
            yield
        finally:
            count = len(sessions.running())
            await asyncio.to_thread(system.stop)
            print(f"shut down: {count} sessions stopped", flush=True)

    app = FastAPI(lifespan=lifespan)

    @app.post("/sessions/{session_id}/calls")
    async def calls(session_id: str, turn: Turn) -> dict[str, Any]:
        loop = await asyncio.to_thread(state["sessions"].get, session_id)
        results = await loop.arun_turn([ToolCall(c.id, c.name, c.arguments) for c in turn.calls])
        return {"results": [
            {"call_id": r.call_id, "ok": r.ok, "content": r.content, "error_kind": r.error_kind} for r in results
        ]}

    @app.get("/sessions/{session_id}/tools")
    async def tools(session_id: str) -> list[dict[str, Any]]:
        loop = await asyncio.to_thread(state["sessions"].get, session_id)
        return await asyncio.to_thread(loop.declarations, "openai")

    @app.delete("/sessions/{session_id}")
    async def stop(session_id: str) -> dict[str, bool]:
        return {"stopped": await asyncio.to_thread(state["sessions"].stop, session_id)}

    return app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _user(client: httpx.AsyncClient, user: str, text: str) -> list[str]:
    turn = {"calls": [{"id": "n1", "name": "note", "arguments": {"text": text}},
                      {"id": "a1", "name": "add", "arguments": {"a": 40, "b": 2}}]}
    first = (await client.post(f"/sessions/{user}/calls", json=turn)).json()["results"]
    later = {"calls": [{"id": "r1", "name": "notes", "arguments": {}}]}
    second = (await client.post(f"/sessions/{user}/calls", json=later)).json()["results"]
    return [r["content"] for r in first + second]


def demo() -> None:
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise SystemExit("the server did not start")
            threading.Event().wait(0.01)

        async def users() -> list[list[str]]:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                return list(await asyncio.gather(_user(client, "ann", "buy milk"), _user(client, "bob", "call mum")))

        for user, got in zip(("ann", "bob"), asyncio.run(users()), strict=True):
            print(user, got)
    finally:
        server.should_exit = True
        thread.join(30)
    print("server stopped" if not thread.is_alive() else "server still running")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, help="serve on 127.0.0.1:PORT until stopped")
    parser.add_argument("--data-dir", help="where the sessions' folders live (default: a temporary folder)")
    args = parser.parse_args()
    if args.port is None:
        demo()
    else:
        uvicorn.run(make_app(args.data_dir), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
