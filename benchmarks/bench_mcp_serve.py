"""Benchmark of ``rho-actors mcp serve --http`` against the official SDK's own server.

One run, one machine, each server in its own process on loopback, the client (the SDK's
``Client``) in this one: a no-op ``tools/call`` through rho (a supervised turn: deadline,
argument validation, transcript) next to the same tool on the SDK's ``MCPServer``
(FastMCP), in both protocol eras: the handshake era (``mode="legacy"``: one
``Mcp-Session-Id``) and 2026-07-28 (every request stands alone; rho's calls name their
session by its handle, as a client keeping one session does). After a warm-up, each
era is measured in turn, the two servers' calls interleaved round by round; the median
(p50) and p99 of each are reported in milliseconds, and the ratio of the p50s, rho ÷ SDK,
per era. Target: <= 1.2x. Reported as PASS/FAIL, never enforced: the exit code is 0
unless a measurement could not be made.

Two rho servers are measured beside the SDK's, one row each: ``--synchronous-commit on``
(the default: each result synced to disk before it is sent) and ``off`` (written to the
OS before it is sent, synced by a group commit within ``--wal-writer-delay``, by default
200 ms, PostgreSQL's). The goal is read on the ``off`` row: the SDK's server records
nothing, so ``off`` compares rho's supervision, validation and a crash-safe transcript
with it; ``on`` adds the disk's sync latency.

Beside it, a figure the machine's load moves less: each server process's CPU time
(user + system, all its threads, from ``/proc/<pid>/stat``) over an era's calls, per
call, and its ratio rho ÷ SDK. The wall p50 ratio stays the goal's figure (a client
waits for wall time); the load average is printed at the start and the end.

Usage::

    .venv/bin/python benchmarks/bench_mcp_serve.py            # 300 calls a pair, about 30 s
    .venv/bin/python benchmarks/bench_mcp_serve.py --quick    # smoke run: 30 calls a pair
    .venv/bin/python benchmarks/bench_mcp_serve.py --json     # one JSON object on stdout
    .venv/bin/python benchmarks/bench_mcp_serve.py --async    # the no-op tool ``async def`` on both servers
    .venv/bin/python benchmarks/bench_mcp_serve.py --calls 150  # fewer calls a pair: a shorter run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.2
SESSION_META_KEY = "rho-actors/session"
SERVERS = ("rho_on", "rho_off", "sdk")  # rho with --synchronous-commit on (the default) and off, the SDK's

RHO_TOOL = '''
from rho_actors import tool

@tool
def noop() -> str:
    """Do nothing."""
    return "ok"
'''

SDK_SERVER = '''
import sys
import uvicorn
from mcp.server.mcpserver import MCPServer

server = MCPServer("sdk")

@server.tool()
def noop() -> str:
    """Do nothing."""
    return "ok"

uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_async(source: str) -> str:
    return source.replace("def noop()", "async def noop()")


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime: the stat's 14th and 15th fields


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _wait_listening(port: int, process: subprocess.Popen[bytes], bound_s: float = 60.0) -> None:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it listened")
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on port {port} within {bound_s} s")


@contextlib.contextmanager
def _servers(folder: Path, token: str, is_async: bool = False) -> Iterator[dict[str, tuple[str, int]]]:
    """Both servers started, each in its own process: ``{"rho": (url, pid), "sdk": (url, pid)}``;
    ``is_async``: their no-op tool is an ``async def``."""
    tools, sdk_server = folder / "bench_tools.py", _as_async(SDK_SERVER) if is_async else SDK_SERVER
    tools.write_text(_as_async(RHO_TOOL) if is_async else RHO_TOOL)
    ports = {server: _free_port() for server in SERVERS}
    env = {**os.environ, "RHO_MCP_TOKEN": token, "PYTHONPATH": os.pathsep.join([str(ROOT), str(folder)])}
    started = {server: subprocess.Popen(
        [sys.executable, "-m", "rho_actors.cli", "mcp", "serve", "--tools", str(tools), "--http",
         f"127.0.0.1:{ports[server]}", "--data-dir", str(folder / server), "--unconfined", "--synchronous-commit",
         server.split("_")[-1]] if server != "sdk" else [sys.executable, "-c", sdk_server, str(ports[server])],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL) for server in SERVERS}
    try:
        for server, process in started.items():
            _wait_listening(ports[server], process)
        yield {server: (f"http://127.0.0.1:{ports[server]}/mcp", process.pid) for server, process in started.items()}
    finally:
        for process in started.values():
            process.kill()
            process.wait(10)


@contextlib.asynccontextmanager
async def _client(url: str, mode: str, token: str) -> AsyncIterator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        yield client


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3)}


async def _measure(servers: dict[str, tuple[str, int]], token: str, calls: int, warmup: int) -> dict[str, Any]:
    eras = ("legacy", "2026-07-28")
    pairs = [(server, era) for era in eras for server in SERVERS]
    samples: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    cpu: dict[tuple[str, str], float] = {}
    async with contextlib.AsyncExitStack() as stack:
        clients = {pair: await stack.enter_async_context(_client(servers[pair[0]][0], pair[1], token))
                   for pair in pairs}
        metas: dict[tuple[str, str], Any] = {pair: None for pair in pairs}
        for pair, client in clients.items():  # the warm-up; a 2026-07-28 rho client keeps the session it got
            for _ in range(warmup):
                result = await client.call_tool("noop", {}, meta=metas[pair])
                if result.is_error:
                    raise RuntimeError(f"{pair}: the no-op call failed: {result.content}")
                said = (result.meta or {}).get(SESSION_META_KEY)
                if said is not None:
                    metas[pair] = {SESSION_META_KEY: said}
        for era in eras:
            measured = [pair for pair in pairs if pair[1] == era]
            before = {pair: _cpu_s(servers[pair[0]][1]) for pair in measured}
            for _ in range(calls):
                for pair in measured:
                    began = time.perf_counter()
                    result = await clients[pair].call_tool("noop", {}, meta=metas[pair])
                    samples[pair].append(time.perf_counter() - began)
                    if result.is_error:
                        raise RuntimeError(f"{pair}: the no-op call failed: {result.content}")
            for pair in measured:
                cpu[pair] = _cpu_s(servers[pair[0]][1]) - before[pair]
    report: dict[str, Any] = {"calls_per_pair": calls}
    for era in eras:
        sdk = _summary(samples[("sdk", era)])
        sdk_cpu = cpu[("sdk", era)] / calls * 1000
        report[era] = {"sdk": {**sdk, "cpu_ms_per_call": round(sdk_cpu, 3)}}
        for server in SERVERS[:-1]:
            rho = _summary(samples[(server, era)])
            ratio = rho["p50_ms"] / sdk["p50_ms"]
            rho_cpu = cpu[(server, era)] / calls * 1000
            report[era][server] = {**rho, "cpu_ms_per_call": round(rho_cpu, 3), "ratio_p50": round(ratio, 3),
                                   "ratio_cpu": round(rho_cpu / sdk_cpu, 3) if sdk_cpu else None,
                                   "target": f"<= {TARGET}x", "verdict": "PASS" if ratio <= TARGET else "FAIL"}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run with few samples")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--async", dest="is_async", action="store_true", help="the no-op tool is an async def")
    parser.add_argument("--calls", type=int, default=None, metavar="N",
                        help="calls a pair and era (default 300; --quick: 30)")
    options = parser.parse_args(argv)
    calls, warmup = (30, 5) if options.quick else (300, 30)
    if options.calls is not None:
        if options.calls < 1:
            parser.error(f"--calls must be at least 1, got {options.calls}")
        calls = options.calls
    token = secrets.token_hex(32)
    load_start = _load()
    with tempfile.TemporaryDirectory() as folder, _servers(Path(folder), token, options.is_async) as servers:
        report = anyio.run(_measure, servers, token, calls, warmup)
    report["tool"] = "async def" if options.is_async else "def"
    report["environment"] = {"cpus": os.cpu_count(), "load_avg_1m_start": load_start, "load_avg_1m_end": _load()}
    if options.json:
        print(json.dumps(report))
        return 0
    env = report["environment"]
    print(f"no-op tools/call ({report['tool']}) over HTTP, {calls} calls a pair, interleaved (ms); {env['cpus']} CPUs, "
          f"load {env['load_avg_1m_start']} -> {env['load_avg_1m_end']}")
    for era in ("legacy", "2026-07-28"):
        sdk = report[era]["sdk"]
        for server in SERVERS[:-1]:
            r = report[era][server]
            cpu_ratio = "n/a" if r["ratio_cpu"] is None else f"{r['ratio_cpu']:.2f}x"
            print(f"  {era:>10} synchronous_commit {server.split('_')[-1]:>3}: rho p50 {r['p50_ms']:.2f} p99 "
                  f"{r['p99_ms']:.2f} | SDK p50 {sdk['p50_ms']:.2f} p99 {sdk['p99_ms']:.2f} | "
                  f"rho/SDK {r['ratio_p50']:.2f}x (target {r['target']}): {r['verdict']} | "
                  f"server CPU a call rho {r['cpu_ms_per_call']:.2f} SDK {sdk['cpu_ms_per_call']:.2f} ms: {cpu_ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
