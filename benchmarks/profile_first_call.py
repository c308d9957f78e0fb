"""Where the first trusted ``process`` call after registration spends its time, hop by
hop, host side and worker side, next to a warm call and a warm call after the same
idle pause ("paused").

A measuring aid for issue #40 (not a benchmark with a target; the target is
``cold_start.py`` part (a)). It wraps (never edits) methods in this process only: on
the host, the loop's ``Turns``, the pool's ``try_start``/``_open_on``/``_finish`` and
the reply's wait; in the worker, its ``Channel`` and ``serve_request``. The fork server
imports this script's top level (``__mp_main__``), so a worker runs the worker-side
wrappers; each worker writes its stamps to a file after it has sent its reply (off the
call's path). ``time.perf_counter_ns`` is ``CLOCK_MONOTONIC``, shared by both processes.

The same sequence as ``cold_start.py`` part (a): a system registers a no-op ``process``
tool and a ``thread`` one, waits until its warm workers idle and hold the tool, opens a
session with a thread call, pauses :data:`PAUSE_S`, makes its first process call, then
warm calls, then one more after the same pause; each call's arguments its own.

With ``RHO_PROFILE_CPU=1`` nothing is wrapped, and each call's CPU is measured instead:
the host thread's (``time.thread_time``) and its minor page faults, the workers' CPU,
run-queue delay and minor page faults (``/proc/<pid>/schedstat``, ``/proc/<pid>/stat``).
``--verbose``: each round's first and paused call; ``--prewarm N``: N process calls of
another session before the session opens; ``--same-text``: every call's arguments ``{}``;
``--pause S``: the idle before the paused call (default :data:`PAUSE_S`).

Usage::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/profile_first_call.py --rounds 8
    RHO_PROFILE_CPU=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/profile_first_call.py --rounds 12 --verbose
"""

from __future__ import annotations

import argparse
import glob
import itertools
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from rho_actors import ActorSystem, ToolCall
from rho_actors.loop import turns as turns_module
from rho_actors.sandbox import channel as channel_module
from rho_actors.sandbox import pool as pool_module
from rho_actors.sandbox import replies as replies_module
from rho_actors.sandbox import wire as wire_module
from rho_actors.sandbox import worker as worker_module

PAUSE_S = 0.2
_DIR = os.environ.setdefault("RHO_PROFILE_FIRST_DIR", tempfile.mkdtemp(prefix="rho-first-"))
_stamps: dict[str, int] = {}


def _stamp(name: str, method: Callable[..., Any], after: str | None = None) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _stamps.setdefault(name, time.perf_counter_ns())
        out = method(*args, **kwargs)
        if after is not None:
            _stamps.setdefault(after, time.perf_counter_ns())
        return out

    return wrapped


def _host() -> None:
    turns = turns_module.Turns
    turns.submit = _stamp("h.submit", turns.submit)  # type: ignore[method-assign]
    turns._dispatch = _stamp("h.dispatch", turns._dispatch, "h.dispatched")  # type: ignore[method-assign]
    wp = pool_module.WorkerPool
    wp.try_start = _stamp("h.try_start", wp.try_start)  # type: ignore[method-assign]
    wp._take_idle = _stamp("h.take_idle", wp._take_idle)  # type: ignore[method-assign]
    wp._open_on = _stamp("h.open_on", wp._open_on)  # type: ignore[method-assign]
    ch = channel_module.Channel
    ch.write_some = _stamp("h.write", ch.write_some, "h.written")  # type: ignore[method-assign]
    rp = replies_module.Replies
    rp.serve_here = _stamp("h.serve_here", rp.serve_here)  # type: ignore[method-assign]
    rp._serve = _stamp("h.read", rp._serve)  # type: ignore[method-assign]
    wp._finish = _stamp("h.finish", wp._finish, "h.finished")  # type: ignore[method-assign]
    wp._replied = _stamp("h.replied", wp._replied, "h.decoded")  # type: ignore[method-assign]


_worker_stamps: list[tuple[str, int]] = []


def _worker() -> None:
    """Worker side: stamps of each call, written out once its reply is sent."""
    ch = channel_module.Channel
    recv, send = ch.recv, ch.send

    def w_recv(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = recv(self, *args, **kwargs)
        _worker_stamps.append(("w.received", time.perf_counter_ns()))
        return out

    def w_send(self: Any, tag: bytes, body: bytes, *args: Any, **kwargs: Any) -> Any:
        _worker_stamps.append(("w.send", time.perf_counter_ns()))
        out = send(self, tag, body, *args, **kwargs)
        if tag in (b"R", b"X") or len(body) > 0:
            with open(os.path.join(_DIR, f"w-{os.getpid()}"), "a") as f:
                f.write(" ".join(f"{k}={v}" for k, v in _worker_stamps) + "\n")
        _worker_stamps.clear()
        return out

    ch.recv, ch.send = w_recv, w_send  # type: ignore[method-assign]
    decode, serve = wire_module.decode_call, worker_module.serve_request

    def w_decode(body: bytes) -> wire_module.CallRequest:
        out = decode(body)
        _worker_stamps.append(("w.decoded", time.perf_counter_ns()))
        return out

    def w_serve(request: Any, *args: Any) -> Any:
        out = serve(request, *args)
        _worker_stamps.append(("w.served", time.perf_counter_ns()))
        return out

    wire_module.decode_call = w_decode
    worker_module.serve_request = w_serve  # type: ignore[assignment]


_STAMPED = not os.environ.get("RHO_PROFILE_CPU")
"""Stamps hop by hop (default), or (``RHO_PROFILE_CPU=1``) no wrapper anywhere: each
call's CPU, the host thread's and its worker's (``/proc/<pid>/schedstat``)."""

if __name__ != "__main__" and _STAMPED:  # the fork server's import of this script: its workers' side
    _worker()


class Quick:
    """A trusted no-op tool."""

    name = staticmethod(lambda: "quick")
    description = staticmethod(lambda: "Nothing.")
    parameter_schema = staticmethod(lambda: {"type": "object", "properties": {"tag": {"type": "string"}}})

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        return "ok"


class QuickThread(Quick):
    name = staticmethod(lambda: "quick_thread")


HOPS = (
    ("caller: run_turn to the turn's submit", "t0", "h.submit"),
    ("caller: submit to dispatch (decode, validate)", "h.submit", "h.dispatch"),
    ("caller: dispatch to try_start", "h.dispatch", "h.try_start"),
    ("pool: try_start to take_idle (ship, grant, request)", "h.try_start", "h.take_idle"),
    ("pool: take_idle to _open_on", "h.take_idle", "h.open_on"),
    ("pool: _open_on to the write (encode)", "h.open_on", "h.write"),
    ("pool: the write", "h.write", "h.written"),
    ("caller: written to serve_here", "h.written", "h.serve_here"),
    ("worker: woken, CALL read (from the write)", "h.write", "w.received"),
    ("worker: decode", "w.received", "w.decoded"),
    ("worker: run, result encoded", "w.decoded", "w.send"),
    ("host: woken by the reply (from worker's send)", "w.send", "h.read"),
    ("host: read to _finish", "h.read", "h.finish"),
    ("host: _finish to decoded", "h.finish", "h.decoded"),
    ("host: decoded to finished", "h.decoded", "h.finished"),
    ("caller: finished to run_turn's return", "h.finished", "t1"),
    ("total", "t0", "t1"),
)
CPU = (("host thread CPU", "c.host"), ("host thread minor page faults (count)", "c.host_faults"),
       ("worker CPU", "c.worker"), ("worker run delay", "c.worker_delay"),
       ("worker minor page faults (count)", "c.worker_faults"))
_calls = itertools.count()


def _timed(loop: Any, tool: str = "quick", pids: list[int] | None = None, same_text: bool = False) -> dict[str, int]:
    """One call of ``tool`` with arguments of its own (``same_text``: ``{}`` each time,
    which the session remembers valid after its first), its stamps and CPU."""
    arguments = "{}" if same_text else f'{{"tag": "call {next(_calls)}"}}'
    _stamps.clear()
    before = _sched(pids or [])
    f0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    c0 = time.thread_time_ns()
    t0 = time.perf_counter_ns()
    [result] = loop.run_turn([ToolCall("c", tool, arguments)])
    _stamps["t1"] = time.perf_counter_ns()
    _stamps["c.host"] = time.thread_time_ns() - c0
    _stamps["c.host_faults"] = 1000 * (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - f0)
    after = _sched(pids or [])
    _stamps["c.worker"] = sum(after[p][0] - before[p][0] for p in after if p in before)
    _stamps["c.worker_delay"] = sum(after[p][1] - before[p][1] for p in after if p in before)
    _stamps["c.worker_faults"] = 1000 * sum(after[p][2] - before[p][2] for p in after if p in before)
    _stamps["t0"] = t0
    if not result.ok:
        raise RuntimeError(f"{result.error_kind}: {result.content}")
    return dict(_stamps)


def _worker_lines() -> list[dict[str, int]]:
    out = []
    for path in glob.glob(os.path.join(_DIR, "w-*")):
        with open(path) as f:
            for line in f:
                out.append({k: int(v) for k, v in (p.split("=") for p in line.split())})
        os.unlink(path)
    return out


def _merge(host: dict[str, int], workers: list[dict[str, int]]) -> dict[str, int]:
    """The host's stamps with those of the worker call inside its write..read span."""
    for w in workers:
        if host.get("h.write", 0) <= w.get("w.received", -1) <= host.get("t1", 0):
            return {**host, **w}
    return host


def _sched(pids: list[int]) -> dict[int, tuple[int, int, int]]:
    """Each worker's CPU and run delay (ns, ``/proc/<pid>/schedstat``) and its minor
    page faults (``/proc/<pid>/stat``)."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                cpu, delay = (int(x) for x in f.read().split()[:2])
            with open(f"/proc/{pid}/stat") as f:
                minflt = int(f.read().rsplit(")", 1)[1].split()[7])
        except OSError:
            continue
        out[pid] = (cpu, delay, minflt)
    return out


def _warmed(system: ActorSystem) -> None:
    until = time.monotonic() + 60
    while system.stats().get("workers_idle", 0) < 2 or system.stats().get("workers_loaded", 2) < 2:
        if time.monotonic() > until:
            raise RuntimeError("no warm worker")
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--prewarm", type=int, default=0, help="process calls of another session before")
    parser.add_argument("--same-text", action="store_true", help="every call's arguments {} (remembered valid)")
    parser.add_argument("--pause", type=float, default=PAUSE_S, help="idle before the paused call (s)")
    args = parser.parse_args()
    _host()
    kinds: dict[str, list[dict[str, int]]] = {"first": [], "warm": [], "paused": []}
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="rho-bench-") as tmp, ActorSystem(tmp) as system:
            system.register(Quick, isolation="process")
            system.register(QuickThread, isolation="thread")
            _warmed(system)
            _worker_lines()  # the warm-up's
            if args.prewarm:
                other = system.start_loop("w")
                for i in range(args.prewarm):
                    other.run_turn([ToolCall("c", "quick", f'{{"n": {i}}}')])
            loop = system.start_loop("s")
            _timed(loop, "quick_thread")
            time.sleep(PAUSE_S)
            pids = system.worker_pids()
            calls = [("first", _timed(loop, pids=pids, same_text=args.same_text))]
            calls += [("warm", _timed(loop, pids=pids, same_text=args.same_text)) for _ in range(args.warm)]
            time.sleep(args.pause)
            calls.append(("paused", _timed(loop, pids=pids, same_text=args.same_text)))
            time.sleep(0.05)
            workers = _worker_lines()
            for kind, stamps in calls:
                kinds[kind].append(_merge(stamps, workers))
            if args.verbose:
                f, p = kinds["first"][-1], kinds["paused"][-1]
                print(f"first / paused: total {(f['t1'] - f['t0']) / 1000:.0f} / {(p['t1'] - p['t0']) / 1000:.0f} us, "
                      f"host CPU {f['c.host'] / 1000:.0f} / {p['c.host'] / 1000:.0f}, worker CPU "
                      f"{f['c.worker'] / 1000:.0f} / {p['c.worker'] / 1000:.0f}, worker faults "
                      f"{f['c.worker_faults'] // 1000} / {p['c.worker_faults'] // 1000}; load {os.getloadavg()[0]:.1f}")
    print(f"load {os.getloadavg()[0]:.2f}; medians, us (n first/warm/paused: "
          f"{len(kinds['first'])}/{len(kinds['warm'])}/{len(kinds['paused'])})")
    print(f"{'hop':<52} {'first':>8} {'warm':>8} {'paused':>8}")
    for label, a, b in HOPS:
        row = []
        for kind in ("first", "warm", "paused"):
            spans = [(s[b] - s[a]) / 1000 for s in kinds[kind] if a in s and b in s]
            row.append(f"{statistics.median(spans):8.1f}" if spans else f"{'-':>8}")
        print(f"{label:<52} {' '.join(row)}")
    for label, key in CPU:
        row = [f"{statistics.median([s[key] / 1000 for s in kinds[kind]]):8.1f}"
               for kind in ("first", "warm", "paused")]
        print(f"{label:<52} {' '.join(row)}")


if __name__ == "__main__":
    main()
