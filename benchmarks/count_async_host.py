"""N no-op calls through one async-host path, for counting instructions per call (PROFILE §11).

Not a benchmark with targets: run it under callgrind twice (``/work/wt/instr.sh`` or
``valgrind --tool=callgrind``), with N = 1,100 and N = 100, and divide the difference by
1,000: start-up and warm-up cancel out. Every path yields to its event loop once per ten
calls (``asyncio.sleep(0)``), as a host does now and then.

Paths: ``rho_async`` (``arun_turn`` of an ``async`` ``@tool``: inline on the event loop),
``rho_sync`` (``arun_turn`` of a sync ``@tool``: one hop to a call thread and back),
``rho_run`` (``run_turn`` of the sync tool, no event loop), ``oa_sync`` / ``oa_async``
(the OpenAI Agents SDK's ``FunctionTool.on_invoke_tool`` of the same tools), and two
floors: ``to_thread`` (``asyncio.to_thread`` of the no-op) and ``hop`` (a waiting thread
woken through a ``SimpleQueue`` that answers with ``call_soon_threadsafe``); and
``sync_hop``, the floor under ``rho_run`` (no event loop: the job handed to a waiting
thread through a ``SimpleQueue``, the caller waiting on a lock that thread releases).
And the task apart (PROFILE §38): ``task_step`` (a no-op coroutine run as a task of its
own, its one step at the host's next yield) and ``bare_step`` (the same coroutine stepped
in a copy of the context, no task): their difference is what a task costs a coroutine
that ends in its first step.

Usage::

    .venv/bin/python benchmarks/count_async_host.py rho_async 1100
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rho_actors import ActorSystem, ToolCall, tool

WARMUP = 20
PATHS = ("rho_async", "rho_sync", "rho_run", "oa_sync", "oa_async", "to_thread", "hop", "sync_hop", "task_step",
         "bare_step")


def noop_work() -> str:
    return "ok"


async def anoop_work() -> str:
    return "ok"


@tool(name="noop")
def rho_noop() -> str:
    """Do nothing."""
    return "ok"


@tool(name="anoop")
async def rho_anoop() -> str:
    """Do nothing (async)."""
    return "ok"


async def repeat(one: Callable[[], Awaitable[Any]], n: int) -> None:
    for _ in range(WARMUP):
        await one()
    for i in range(n):
        await one()
        if i % 10 == 9:
            await asyncio.sleep(0)  # a host yields to its loop now and then


def floors(path: str, n: int) -> None:
    jobs: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[str]] | None] = queue.SimpleQueue()

    def serve() -> None:
        while (job := jobs.get()) is not None:
            aio, future = job
            aio.call_soon_threadsafe(future.set_result, noop_work())

    threading.Thread(target=serve, daemon=True).start()

    async def one() -> None:
        if path == "to_thread":
            await asyncio.to_thread(noop_work)
            return
        aio = asyncio.get_running_loop()
        future = aio.create_future()
        jobs.put((aio, future))
        await future

    asyncio.run(repeat(one, n))
    jobs.put(None)


def sync_floor(n: int) -> None:
    jobs: queue.SimpleQueue[tuple[list[str], threading.Lock] | None] = queue.SimpleQueue()

    def serve() -> None:
        while (job := jobs.get()) is not None:
            out, done = job
            out.append(noop_work())
            done.release()

    threading.Thread(target=serve, daemon=True).start()
    for _ in range(WARMUP + n):
        done = threading.Lock()
        done.acquire()
        out: list[str] = []
        jobs.put((out, done))
        done.acquire()
        assert out == ["ok"]
    jobs.put(None)


def step_floor(path: str, n: int) -> None:
    async def one() -> None:
        coro = anoop_work()
        if path == "task_step":
            asyncio.get_running_loop().create_task(coro)  # its one step at the next yield
            return
        try:
            contextvars.copy_context().run(coro.send, None)
        except StopIteration:
            pass

    asyncio.run(repeat(one, n))


def agents_sdk(path: str, n: int) -> None:
    from agents import function_tool
    from agents.tool_context import ToolContext

    sdk_tool = function_tool(noop_work if path == "oa_sync" else anoop_work, name_override="noop")
    ctx = ToolContext(context=None, tool_name="noop", tool_call_id="c1", tool_arguments="{}")
    asyncio.run(repeat(lambda: sdk_tool.on_invoke_tool(ctx, "{}"), n))


def rho(path: str, n: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        system = ActorSystem(data_dir=Path(folder))
        try:
            system.register(rho_noop)
            system.register(rho_anoop)
            loop = system.start_loop("s")
            call = [ToolCall("c1", "anoop" if path == "rho_async" else "noop", "{}")]
            if path == "rho_run":
                for _ in range(WARMUP + n):
                    assert loop.run_turn(call)[0].ok
                return

            async def one() -> None:
                assert (await loop.arun_turn(call))[0].ok

            asyncio.run(repeat(one, n))
        finally:
            system.stop()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in PATHS:
        print(f"usage: count_async_host.py {{{'|'.join(PATHS)}}} N", file=sys.stderr)
        return 2
    path, n = argv[0], int(argv[1])
    if path == "sync_hop":
        sync_floor(n)
    elif path in ("task_step", "bare_step"):
        step_floor(path, n)
    elif path in ("to_thread", "hop"):
        floors(path, n)
    elif path.startswith("oa_"):
        agents_sdk(path, n)
    else:
        rho(path, n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
