"""The governor (DESIGN §4 "The governor"): concurrency places, call budgets, the
repeated-call breaker, rate limits and retries of idempotent calls, through real loops."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import (
    ActorSystem,
    CancelToken,
    ErrorKind,
    GovernorSettings,
    Reply,
    RetryPolicy,
    ScriptedModel,
    ToolCall,
    ToolContext,
    ToolFailure,
    kill,
    prompt,
    tool,
)
from rho_actors.declarations.policy import parse_rate

from .conftest import WAIT_S, slack, wait_for


class Running:
    """How many calls run at once, and the most seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.order: list[str] = []

    def enter(self, label: str = "") -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.order.append(label)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


def calls(name: str, n: int, prefix: str = "c", args: dict[str, Any] | None = None) -> list[ToolCall]:
    return [ToolCall(f"{prefix}{i}", name, json.dumps(args if args is not None else {"i": i})) for i in range(n)]


# --- concurrency ------------------------------------------------------------------------------


def test_a_fan_out_of_800_calls_to_a_capped_tool_never_runs_more_than_its_bound(system: ActorSystem) -> None:
    seen = Running()

    @tool(max_concurrency=4, timeout_ms=120_000)
    def capped(i: int) -> int:
        """Work a little (the first four wait until four run: the bound is reached)."""
        seen.enter()
        if i < 4:
            assert wait_for(lambda: seen.most >= 4)
        time.sleep(0.001)
        seen.leave()
        return i

    system.register(capped)
    results = system.start_loop("fan").run_turn(calls("capped", 800), timeout_s=2 * WAIT_S)
    assert [r.call_id for r in results] == [f"c{i}" for i in range(800)]  # one result each, in the model's order
    assert all(r.ok for r in results) and [r.content for r in results] == [str(i) for i in range(800)]
    assert seen.most == 4  # the bound was reached, and never passed
    stats = system.stats()["governor"]
    assert stats["queued_total"] > 0 and stats["running"] == {"capped": 0} and stats["queued"] == {}


def held_tool(name: str, gate: threading.Event, seen: Running, **policy: Any) -> Any:
    @tool(name=name, **policy)
    def held(label: str) -> str:
        """Wait for the gate."""
        seen.enter(label)
        try:
            gate.wait(WAIT_S)
        finally:
            seen.leave()
        return label

    return held


def test_a_call_finding_no_place_waits_until_its_deadline_then_is_unavailable_naming_the_bound(
        system: ActorSystem) -> None:
    gate, seen = threading.Event(), Running()
    system.register(held_tool("slow", gate, seen, max_concurrency=1, timeout_ms=30_000))
    first = system.start_loop("a").submit_turn([ToolCall("h", "slow", '{"label": "h"}')])
    assert wait_for(lambda: seen.now == 1)
    # registered again with a shorter timeout: the bound is the tool name's, so the running call holds it
    system.unregister("slow")
    system.register(held_tool("slow", gate, seen, max_concurrency=1, timeout_ms=400))
    [refused] = system.start_loop("b").run_turn([ToolCall("w", "slow", '{"label": "w"}')], timeout_s=WAIT_S)
    gate.set()
    assert refused.error_kind is ErrorKind.UNAVAILABLE
    assert refused.content == ("1 calls of tool 'slow' are running; the bound is 1 (max_concurrency), and none "
                               "ended before this call's deadline; it did not run")
    assert refused.duration_ms >= 350  # it waited for a place, within its own deadline
    assert seen.order == ["h"]  # it never ran
    assert first.result(WAIT_S)[0].ok
    assert system.stats()["governor"]["refused"]["unavailable"] == 1


def test_waiting_calls_are_served_in_arrival_order_fairly_across_sessions(system: ActorSystem) -> None:
    gate, seen = threading.Event(), Running()
    system.register(held_tool("one", gate, seen, max_concurrency=1, timeout_ms=30_000))
    holder = system.start_loop("h").submit_turn([ToolCall("h", "one", '{"label": "h"}')])
    assert wait_for(lambda: seen.now == 1)
    wide = system.start_loop("a").submit_turn(
        [ToolCall(f"a{i}", "one", json.dumps({"label": f"a{i}"})) for i in range(3)])
    assert wait_for(lambda: system.stats()["governor"]["queued"].get("one") == 3)
    narrow = system.start_loop("b").submit_turn([ToolCall("b0", "one", '{"label": "b0"}')])
    assert wait_for(lambda: system.stats()["governor"]["queued"].get("one") == 4)
    gate.set()
    assert [r.ok for r in holder.result(WAIT_S) + wide.result(WAIT_S) + narrow.result(WAIT_S)] == [True] * 5
    assert seen.order == ["h", "a0", "b0", "a1", "a2"]  # session b is not kept behind all of a's calls


def test_a_per_session_bound_holds_each_session_and_the_system_bound_all_of_them(system: ActorSystem) -> None:
    seen: dict[str, Running] = {"a": Running(), "b": Running(), "all": Running()}

    @tool(max_concurrency=3, max_concurrency_per_session=2, timeout_ms=60_000)
    def shared(i: int, ctx: ToolContext) -> int:
        """Work a little (the first calls wait until three run: a's two and one of b's)."""
        for key in (ctx.session_id, "all"):
            seen[key].enter()
        if i == 0 or (ctx.session_id == "a" and i == 1):
            assert wait_for(lambda: seen["all"].most >= 3)
        time.sleep(0.005)
        for key in (ctx.session_id, "all"):
            seen[key].leave()
        return i

    system.register(shared)
    turns = [system.start_loop(s).submit_turn(calls("shared", 40)) for s in ("a", "b")]
    assert all(r.ok for t in turns for r in t.result(WAIT_S))
    assert seen["a"].most == 2 and seen["b"].most <= 2 and seen["all"].most == 3


def test_max_thread_calls_bounds_thread_calls_of_every_tool(tmp_path: Path) -> None:
    seen = Running()

    @tool(timeout_ms=60_000)
    def plain(i: int) -> int:
        """Work a little (the first three wait until three run)."""
        seen.enter()
        if i < 3:
            assert wait_for(lambda: seen.most >= 3)
        time.sleep(0.002)
        seen.leave()
        return i

    with ActorSystem(tmp_path, governor=GovernorSettings(max_thread_calls=3)) as system:
        system.register(plain)
        assert all(r.ok for r in system.start_loop("t").run_turn(calls("plain", 60), timeout_s=WAIT_S))
        assert seen.most == 3
        stats = system.stats()["governor"]
        assert stats["max_thread_calls"] == 3 and stats["thread_calls_running"] == 0


def test_a_cancelled_waiting_call_never_runs(system: ActorSystem) -> None:
    gate, seen = threading.Event(), Running()
    system.register(held_tool("one", gate, seen, max_concurrency=1, timeout_ms=30_000))
    holder = system.start_loop("h").submit_turn([ToolCall("h", "one", '{"label": "h"}')])
    assert wait_for(lambda: seen.now == 1)
    token = CancelToken()
    waiting = system.start_loop("w").submit_turn([ToolCall("w", "one", '{"label": "w"}')], cancel=token)
    assert wait_for(lambda: system.stats()["governor"]["queued"].get("one") == 1)
    token.cancel("cancelled")
    assert waiting.result(WAIT_S)[0].error_kind is ErrorKind.CANCELLED
    assert system.stats()["governor"]["queued"] == {}
    gate.set()
    assert holder.result(WAIT_S)[0].ok and seen.order == ["h"]


# --- budgets and the breaker, through the agent loop ------------------------------------------


@tool(max_calls=2)
def lookup(key: str) -> str:
    """Look a key up."""
    return key.upper()


@tool
def same(key: str) -> str:
    """Return the key."""
    return key


@tool(rate="1/min", timeout_ms=20_000)  # far within the minute: the second call's token comes after it
def rare(key: str) -> str:
    """Return the key (an upstream that allows one call a minute)."""
    return key


def test_a_tool_budget_refuses_the_call_past_it_through_the_agent_loop(system: ActorSystem) -> None:
    system.register(lookup)
    loop = system.start_loop("s")
    model = ScriptedModel([
        Reply("", tuple(ToolCall(f"k{i}", "lookup", json.dumps({"key": key})) for i, key in enumerate("xyz"))),
        Reply("done"),
    ])
    result = prompt(loop, "look up three keys", model=model)
    assert result.error is None and result.text == "done"
    [first, second, third] = result.steps[0].results
    assert first.ok and second.ok
    assert third.error_kind is ErrorKind.BUDGET_EXHAUSTED
    assert third.content == ("tool 'lookup' did not run: this session has used its budget of 2 calls of tool "
                             "'lookup' (max_calls)")
    assert system.stats()["governor"]["refused"]["budget_exhausted"] == 1


def test_the_repeated_call_breaker_refuses_the_same_call_past_max_repeats(tmp_path: Path) -> None:
    with ActorSystem(tmp_path, governor=GovernorSettings(max_repeats=2)) as system:
        system.register(same)
        loop = system.start_loop("s")
        repeated = '{"key": "q"}'
        model = ScriptedModel([Reply("", (ToolCall(f"r{i}", "same", repeated),)) for i in range(3)]
                              + [Reply("", (ToolCall("r3", "same", '{"key": "other"}'),)), Reply("ok")])
        result = prompt(loop, "loop", model=model)
        kinds = [step.results[0].error_kind for step in result.steps[:4]]
        assert kinds == [None, None, ErrorKind.REPEATED_CALL, None]  # other arguments still run
        refused = result.steps[2].results[0]
        assert "already ran 2 times in this session with these same arguments" in refused.content
        assert "you already have its result" in refused.content


def test_max_calls_per_prompt_refuses_the_calls_past_it_and_asks_the_model_again(system: ActorSystem) -> None:
    system.register(same)
    loop = system.start_loop("s")
    model = ScriptedModel([Reply("", tuple(calls("same", 3, "p", {"key": "k"}))), Reply("stopped")])
    result = prompt(loop, "go", model=model, max_calls_per_prompt=2)
    assert result.text == "stopped"
    assert [r.error_kind for r in result.steps[0].results] == [None, None, ErrorKind.BUDGET_EXHAUSTED]
    assert result.steps[0].results[2].content.endswith("this prompt has used its budget of 2 tool calls "
                                                       "(max_calls_per_prompt)")
    with pytest.raises(ValueError, match="max_calls_per_prompt must be an int of 1 or more, got 0"):
        prompt(loop, "go", model=model, max_calls_per_prompt=0)


def test_max_calls_per_session_counts_every_tool(tmp_path: Path) -> None:
    with ActorSystem(tmp_path, governor=GovernorSettings(max_calls_per_session=3)) as system:
        system.register(lookup)
        system.register(same)
        loop = system.start_loop("s")
        results = loop.run_turn([ToolCall("a", "lookup", '{"key": "a"}'), ToolCall("b", "same", '{"key": "b"}'),
                                 ToolCall("c", "same", '{"key": "c"}'), ToolCall("d", "same", '{"key": "d"}')])
        assert [r.error_kind for r in results] == [None, None, None, ErrorKind.BUDGET_EXHAUSTED]
        assert "its budget of 3 tool calls (max_calls_per_session)" in results[3].content
        other = system.start_loop("t").run_turn([ToolCall("e", "same", '{"key": "e"}')])  # per session
        assert other[0].ok


def test_a_session_sets_its_own_budget_and_breaker_within_the_systems(tmp_path: Path) -> None:
    with ActorSystem(tmp_path, governor=GovernorSettings(max_calls_per_session=10, max_repeats=3)) as system:
        system.register(same)
        strict = system.start_loop("strict", max_calls_per_session=3, max_repeats=1)
        results = strict.run_turn([ToolCall("a", "same", '{"key": "a"}'), ToolCall("b", "same", '{"key": "a"}'),
                                   ToolCall("c", "same", '{"key": "c"}'), ToolCall("d", "same", '{"key": "d"}'),
                                   ToolCall("e", "same", '{"key": "e"}')])
        assert [r.error_kind for r in results] == [None, ErrorKind.REPEATED_CALL, None, None,
                                                   ErrorKind.BUDGET_EXHAUSTED]
        assert results[1].content == (
            "tool 'same' did not run: it already ran 1 times in this session with these same arguments "
            "(max_repeats=1); you already have its result, use it instead of calling it again")
        assert results[4].content == ("tool 'same' did not run: this session has used its budget of 3 tool calls "
                                      "(max_calls_per_session)")
        # a session that sets none has the system's: the same arguments three times, then refused
        other = system.start_loop("other").run_turn([ToolCall(f"o{i}", "same", '{"key": "a"}') for i in range(4)])
        assert [r.error_kind for r in other] == [None, None, None, ErrorKind.REPEATED_CALL]
        assert "(max_repeats=3)" in other[3].content
        # a session may not loosen the host's bounds, nor set a bad one
        with pytest.raises(ValueError, match=r"max_calls_per_session=11 is looser than the system's "
                                             r"max_calls_per_session=10 \(GovernorSettings\): a session may only "
                                             r"tighten the host's bounds"):
            system.start_loop("loose", max_calls_per_session=11)
        with pytest.raises(ValueError, match="max_repeats must be an int >= 1 or None, got 0"):
            system.start_loop("zero", max_repeats=0)
        with pytest.raises(TypeError, match=r"max_calls_per_session must be an int >= 1 or None, got float 2\.0"):
            system.start_loop("float", max_calls_per_session=2.0)  # type: ignore[arg-type]


def test_a_sessions_own_bounds_hold_where_the_system_has_none_and_after_its_loop_restarts(tmp_path: Path) -> None:
    with ActorSystem(tmp_path, max_restarts=10, max_seconds=60) as system:
        system.register(same)
        loop = system.start_loop("s", max_calls_per_session=2)
        assert [r.ok for r in loop.run_turn(calls("same", 3, "a", {"key": "k"}))] == [True, True, False]
        first = loop.ref
        kill(first)  # the loop crashes: its counts are gone, its bounds are given again
        assert wait_for(lambda: loop.alive and loop.ref is not first)
        results = loop.run_turn(calls("same", 3, "b", {"key": "k"}), timeout_s=WAIT_S)
        assert [r.error_kind for r in results] == [None, None, ErrorKind.BUDGET_EXHAUSTED]
        assert "its budget of 2 tool calls (max_calls_per_session)" in results[2].content
        loop.stop()
        assert wait_for(lambda: not loop.alive)
        again = system.start_loop("s")  # a new loop of the session, without bounds of its own: none hold
        assert all(r.ok for r in again.run_turn(calls("same", 4, "c", {"key": "k"})))


def test_requires_approval_is_a_rule_of_the_call_policy_which_the_governor_does_not_keep(
    system: ActorSystem,
) -> None:
    from rho_actors.declarations.policy import CallPolicy

    @tool(requires_approval=True)
    def wipe() -> str:
        """Wipe everything."""
        return "wiped"

    @tool(requires_approval=lambda args, ctx: args["force"], max_calls=5)
    def remove(force: bool) -> str:
        """Remove a file."""
        return "removed"

    system.register(wipe)
    system.register(remove)
    infos = {info.name: info for info in system.tools()}
    assert infos["wipe"].policy == CallPolicy(requires_approval=True) and infos["wipe"].requires_approval
    assert infos["wipe"].policy.as_data() == {"requires_approval": True} and not infos["wipe"].policy.governed
    assert infos["remove"].policy == CallPolicy(max_calls=5, requires_approval=True)  # a rule: it may ask
    assert infos["remove"].policy.governed
    calls_node = next(n for n in system.tree()["children"] if n["id"] == "calls")
    assert calls_node["governor"]["tools"] == {"remove": {"max_calls": 5, "running": 0, "queued": 0}}
    [pending] = system.start_loop("s").run_turn([ToolCall("w", "wipe", "{}")])
    assert pending.error_kind is ErrorKind.PENDING_APPROVAL


# --- rate limits ---------------------------------------------------------------------------------


def test_a_rate_limited_tool_under_8_host_threads_runs_at_its_rate(system: ActorSystem) -> None:
    starts: list[float] = []
    lock = threading.Lock()

    @tool(rate="100/s", timeout_ms=60_000)
    def metered(i: int) -> int:
        """A call an upstream meters."""
        with lock:
            starts.append(time.monotonic())
        return i

    system.register(metered)
    loops = [system.start_loop(f"r{t}") for t in range(8)]
    failures: list[Any] = []

    def host(t: int) -> None:
        for i in range(50):  # 12.5 calls a second each keep the bucket empty, even on a loaded machine
            [result] = loops[t].run_turn([ToolCall(f"t{t}c{i}", "metered", json.dumps({"i": i}))], timeout_s=WAIT_S)
            if not result.ok:
                failures.append(result)

    threads = [threading.Thread(target=host, args=(t,)) for t in range(8)]
    began = time.monotonic()  # before the bucket exists: no token can be granted earlier
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * WAIT_S)
    assert failures == [] and len(starts) == 400
    starts.sort()
    # the first 100 (the burst) may start at once; each later one waits for its token
    for k in range(100, 400):  # never faster than the bucket allows (burst + rate x time), whatever the load
        assert k + 1 <= 100 + 100 * (starts[k] - began) + 1
    observed = (400 - 100) / (starts[-1] - began)
    assert observed <= 110, observed  # never above the limit (10 % for the clock), whatever the load
    # and at least 90 % of it where 8 host threads keep the bucket empty: on a quiet machine 300 tokens
    # take at most 3.33 s; a loaded one (its threads late to ask) is given slack() over that
    assert starts[-1] - began <= slack(300 / 90), observed


def test_a_call_whose_token_comes_after_its_deadline_is_rate_limited(system: ActorSystem) -> None:
    system.register(rare)
    loop = system.start_loop("s")
    [first] = loop.run_turn([ToolCall("a", "rare", '{"key": "a"}')])
    [second] = loop.run_turn([ToolCall("b", "rare", '{"key": "b"}')])
    assert first.ok and second.error_kind is ErrorKind.RATE_LIMITED and second.error_kind.retryable
    assert second.content.startswith("tool 'rare' did not run: its rate limit of 1/min would let it start only in ")
    assert second.content.endswith(" ms, after this call's deadline")
    assert system.stats()["governor"]["refused"]["rate_limited"] == 1


def test_rates_are_parsed_and_bad_ones_refused() -> None:
    assert parse_rate("10/s").per_s == 10 and parse_rate("90/min").per_s == 1.5 and parse_rate("90/min").burst == 90
    assert parse_rate("0.5/s").burst == 1
    for bad in ("10", "10/day", "-1/s", "0/s", "fast"):
        with pytest.raises(ValueError, match="rate must be 'N/s', 'N/min' or 'N/h' with N > 0"):
            parse_rate(bad)


# --- retries ---------------------------------------------------------------------------------------


def killed_until(attempts_file: Path, kills: int) -> int:
    """Count this attempt in ``attempts_file``; the first ``kills`` attempts kill their worker."""
    with attempts_file.open("a") as f:
        f.write("x")
    attempt = len(attempts_file.read_text())
    if attempt <= kills:
        os.kill(os.getpid(), signal.SIGABRT)
        time.sleep(30)
    return attempt


@tool(idempotent=True, retry=RetryPolicy(attempts=3, initial_s=0.01, max_wait_s=0.05, jitter_s=0.01),
      timeout_ms=30_000)
def flaky_read(kills: int, ctx: ToolContext) -> int:
    """Read something; its worker dies the first times."""
    return killed_until(ctx.data_dir / "attempts", kills)


@tool(timeout_ms=30_000)
def flaky_write(kills: int, ctx: ToolContext) -> int:
    """Write something; its worker dies the first time."""
    return killed_until(ctx.data_dir / "attempts", kills)


def test_an_idempotent_process_call_whose_worker_is_killed_twice_is_retried_to_success(system: ActorSystem) -> None:
    system.register(flaky_read, isolation="process")
    events: list[Any] = []
    system.subscribe(lambda e: events.append(e) if getattr(e, "kind", None) == "retried" else None)
    [result] = system.start_loop("r").run_turn([ToolCall("c", "flaky_read", '{"kills": 2}')], timeout_s=WAIT_S)
    assert result.ok and result.content == "3"
    assert result.details["attempts"] == 3
    assert [f["error_kind"] for f in result.details["failures"]] == ["crashed", "crashed"]
    assert all("SIGABRT" in f["message"] for f in result.details["failures"])
    assert [(e.call_id, e.outcome) for e in events] == [("c", "crashed"), ("c", "crashed")]
    assert system.stats()["governor"]["retried"] == 2


def test_a_non_idempotent_process_call_killed_once_is_crashed_after_one_attempt(system: ActorSystem) -> None:
    system.register(flaky_write, isolation="process")
    loop = system.start_loop("w")
    [result] = loop.run_turn([ToolCall("c", "flaky_write", '{"kills": 1}')], timeout_s=WAIT_S)
    assert result.error_kind is ErrorKind.CRASHED and "SIGABRT" in result.content
    assert not (isinstance(result.details, dict) and "attempts" in result.details)
    assert (loop.data_dir / "attempts").read_text() == "x"  # one attempt
    assert system.stats()["governor"]["retried"] == 0


def _always_busy(starts: list[tuple[float, float]], timeout_ms: int) -> Any:
    @tool(idempotent=True, retry=RetryPolicy(attempts=100, initial_s=0.05, max_wait_s=0.05, jitter_s=0.0),
          timeout_ms=timeout_ms)
    def upstream(ctx: ToolContext) -> str:
        """An upstream that is always busy."""
        assert ctx.deadline is not None
        starts.append((time.monotonic(), ctx.deadline))
        raise ToolFailure("raised", "the upstream is busy (429)", retryable=True)

    return upstream


def test_retries_never_outlive_the_deadline(system: ActorSystem) -> None:
    loop = system.start_loop("d")
    # two attempts at least begin within the deadline: on a loaded machine a second one may not within 1.5 s (its
    # thread late), then within 4.5 s (at most 90 attempts of 50 ms: the policy's 100 are never all made)
    for timeout_ms in (1_500, 4_500):
        starts: list[tuple[float, float]] = []
        system.register(_always_busy(starts, timeout_ms))
        [result] = loop.run_turn([ToolCall("c", "upstream", "{}")], timeout_s=WAIT_S)
        system.unregister("upstream")
        if len(starts) >= 2:
            break
    # the last attempt's own answer, or (it began just before the deadline and answered past it) the timeout
    assert result.error_kind in (ErrorKind.RAISED, ErrorKind.TIMEOUT), result.content
    attempts = result.details["attempts"]
    assert 2 <= attempts < 100 and 2 <= len(starts) <= attempts  # (a last attempt may not have begun by then)
    # every attempt but the last began within the one deadline; the last too when it answered itself (an attempt
    # started just before the deadline may find its thread only after it: the deadline answers it, `timeout`)
    assert all(started < deadline for started, deadline in starts[:-1])
    assert result.error_kind is ErrorKind.TIMEOUT or starts[-1][0] < starts[-1][1]
    assert len({deadline for _, deadline in starts}) == 1
    assert len(result.details["failures"]) == attempts - 1
    assert {f["message"] for f in result.details["failures"]} == {"the upstream is busy (429)"}


def test_a_timeout_is_retried_only_when_opted_in(system: ActorSystem) -> None:
    tries: list[int] = []

    def run(optin: bool) -> Any:
        @tool(name=f"timing_{optin}", idempotent=True, timeout_ms=int(WAIT_S * 1000),
              retry=RetryPolicy(attempts=2, initial_s=0.01, max_wait_s=0.01, jitter_s=0.0, on_timeout=optin))
        def timing() -> str:
            """An upstream that times out once."""
            tries.append(1)
            if len(tries) % 2:
                raise ToolFailure("timeout", "the upstream did not answer within 1 s")
            return "answered"

        return timing

    system.register(run(False))
    system.register(run(True))
    loop = system.start_loop("t")
    [plain] = loop.run_turn([ToolCall("a", "timing_False", "{}")])
    tries.clear()
    [opted] = loop.run_turn([ToolCall("b", "timing_True", "{}")])
    assert plain.error_kind is ErrorKind.TIMEOUT and opted.ok and opted.details["attempts"] == 2


# --- the declaration, tree() and stats() ---------------------------------------------------------


def test_bad_policy_options_are_refused_at_decoration() -> None:
    def f(x: int) -> int:
        """F."""
        return x

    with pytest.raises(ValueError, match="@tool: max_concurrency must be an int >= 1 or None, got 0"):
        tool(max_concurrency=0)(f)
    with pytest.raises(TypeError, match=r"max_calls must be an int >= 1 or None, got float 2\.0"):
        tool(max_calls=2.0)(f)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="retry is given but the tool is not idempotent=True"):
        tool(retry=RetryPolicy())(f)
    with pytest.raises(ValueError, match="rate must be"):
        tool(rate="often")(f)
    with pytest.raises(ValueError, match="attempts must be at least 1, not 0"):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError, match="max_repeats must be an int >= 1 or None, got 0"):
        GovernorSettings(max_repeats=0)


def test_a_class_tool_declares_its_policy_by_callbacks_and_a_bad_answer_sets_no_bound(
        system: ActorSystem, logs: list[str]) -> None:
    from .helpers import make_tool

    system.register(make_tool("classy", max_concurrency=2, rate_limit="5/s", idempotent=True, max_calls="many"))
    [info] = [i for i in system.tools() if i.name == "classy"]
    assert info.policy.max_concurrency == 2 and info.policy.rate is not None and info.policy.rate.per_s == 5
    assert info.policy.idempotent and info.policy.max_calls is None
    assert any("max_calls() gave 'many' (str): max_calls must be an int >= 1 or None" in line for line in logs)


@tool(max_concurrency=2, rate="5/s", idempotent=True, retry=RetryPolicy(attempts=2, initial_s=0.01))
def outside(key: str) -> str:
    """Return the key (read and run out of process)."""
    return key


def test_an_untrusted_tools_policy_is_read_out_of_process_as_plain_data(system: ActorSystem) -> None:
    from rho_actors import untrusted

    system.register(untrusted(outside))
    [info] = [i for i in system.tools() if i.name == "outside"]
    assert info.policy.as_data() == {"max_concurrency": 2, "rate": "5/s", "idempotent": True, "retry": {
        "attempts": 2, "initial_s": 0.01, "max_wait_s": 8.0, "jitter_s": 0.5, "total_s": 120.0, "on_timeout": False}}
    [result] = system.start_loop("u").run_turn([ToolCall("c", "outside", '{"key": "k"}')], timeout_s=WAIT_S)
    assert result.ok and result.content == "k"


def test_tree_and_stats_show_the_bounds_and_their_use(system: ActorSystem) -> None:
    gate, seen = threading.Event(), Running()
    system.register(held_tool("shown", gate, seen, max_concurrency=1, rate="50/s", timeout_ms=30_000))
    holder = system.start_loop("h").submit_turn([ToolCall("h", "shown", '{"label": "h"}')])
    waiter = system.start_loop("w").submit_turn([ToolCall("w", "shown", '{"label": "w"}')])
    assert wait_for(lambda: system.stats()["governor"]["queued"].get("shown") == 1)
    [calls_node] = [n for n in system.tree()["children"] if n["id"] == "calls"]
    view = calls_node["governor"]
    assert view["tools"]["shown"] == {"max_concurrency": 1, "rate": "50/s", "running": 1, "queued": 1}
    assert view["max_thread_calls"] == system.stats()["governor"]["max_thread_calls"] >= 256
    gate.set()
    assert holder.result(WAIT_S)[0].ok and waiter.result(WAIT_S)[0].ok
    assert system.stats()["governor"]["running"] == {"shown": 0}


# --- the call lifecycle in the transcript ------------------------------------------------------


def call_records(loop: Any) -> list[dict[str, Any]]:
    lines = (loop.data_dir / "transcript.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] in ("call", "result")]


def test_the_agent_loop_records_queued_and_retried_calls_as_lifecycle_moves(system: ActorSystem) -> None:
    from rho_actors.lifecycle import fold

    answers: Iterator[ToolFailure | str] = iter([ToolFailure("unavailable", "busy"), ToolFailure("crashed", "dropped"),
                                                  "ok"])

    @tool(idempotent=True, retry=RetryPolicy(attempts=3, initial_s=0.001, max_wait_s=0.002, jitter_s=0.0))
    def fetch_once() -> str:
        """Fails twice, then answers."""
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    @tool(max_concurrency=1)
    def single(label: str) -> str:
        """One at a time; the first waits until the second is queued behind it."""
        if label == "first":
            assert wait_for(lambda: system.stats()["governor"]["queued"].get("single") == 1)
        return label

    system.register(fetch_once)
    system.register(single)
    loop = system.start_loop("moves")
    model = ScriptedModel([
        Reply("", (ToolCall("r", "fetch_once", "{}"),)),
        Reply("", (ToolCall("s1", "single", '{"label": "first"}'), ToolCall("s2", "single", '{"label": "second"}'))),
        Reply("done"),
    ])
    result = prompt(loop, "go", model=model)
    assert result.error is None and result.steps[0].results[0].details["attempts"] == 3
    records = call_records(loop)
    moves = [(r["call_id"], r["state"], r.get("attempt"), r.get("error_kind")) for r in records if r["type"] == "call"]
    assert moves == [
        ("r", "running", 1, None), ("r", "retried", 1, "unavailable"), ("r", "running", 2, None),
        ("r", "retried", 2, "crashed"), ("r", "running", 3, None), ("s2", "queued", None, None),
    ]
    [queued] = [r for r in records if r.get("state") == "queued"]
    assert queued["reason"] == "1 running, the bound is 1 (max_concurrency)" and queued["index"] == 1
    tracks = fold(records)  # the lifecycle reads them back: every move allowed
    assert tracks["r"].state == "settled" and tracks["s2"].state == "settled"


# --- an MCP server's rate and idempotent hints -----------------------------------------------------


def test_an_mcp_servers_rate_is_one_bucket_for_all_its_tools(system: ActorSystem, tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    import sys

    from rho_actors.mcp import MCPServer

    fixture = str(Path(__file__).parent / "mcp_fixtures" / "fixture_server.py")
    source = MCPServer(command=[sys.executable, fixture, str(tmp_path)], name="metered", rate="1/min",
                       timeout_ms=int(min(slack(2.0), 30.0) * 1000),  # below the minute the next token is away:
                       connect_timeout_s=WAIT_S)  # a second call is refused at once, not queued
    system.add_source(source, poll_s=None)
    assert wait_for(lambda: {"echo", "shout"} <= {info.name for info in system.tools()})
    [echo_info] = [info for info in system.tools() if info.name == "echo"]
    assert echo_info.policy.as_data() == {"rate": "1/min", "rate_group": "mcp:metered"}
    loop = system.start_loop("m")
    [first] = loop.run_turn([ToolCall("c1", "echo", {"text": "hi"})], timeout_s=WAIT_S)
    [second] = loop.run_turn([ToolCall("c2", "shout", {"text": "hi"})], timeout_s=WAIT_S)  # another tool, one bucket
    assert first.ok and second.error_kind is ErrorKind.RATE_LIMITED and "1/min" in second.content
    with pytest.raises(ValueError, match="rate must be 'N/s', 'N/min' or 'N/h'"):
        MCPServer(command=[sys.executable, fixture], rate="fast")


def test_an_mcp_tools_idempotent_hint_counts_only_when_the_host_trusts_the_hints() -> None:
    pytest.importorskip("mcp")
    from rho_actors.mcp import MCPServer
    from rho_actors.mcp.source import MCPTool

    declared = {"name": "lookup", "inputSchema": {"type": "object"}, "annotations": {"idempotentHint": True}}
    trusting, wary = MCPServer(command=["srv"], idempotent_hints=True), MCPServer(command=["srv"])
    assert MCPTool(trusting, declared).idempotent() is True
    assert MCPTool(wary, declared).idempotent() is False
    assert MCPTool(trusting, {**declared, "annotations": {"idempotentHint": "yes"}}).idempotent() is False


def test_a_gateway_configuration_gives_an_upstream_server_a_rate(tmp_path: Path) -> None:
    from rho_actors.mcp.gateway import GatewayConfigError, load_config

    config = tmp_path / "gateway.toml"
    config.write_text('[servers.search]\ncommand = "python -m search"\nrate = "600/min"\nidempotent_hints = true\n')
    [spec] = load_config(config).servers
    assert spec.rate == "600/min" and spec.idempotent_hints is True
    config.write_text('[servers.search]\ncommand = "python -m search"\nrate = "often"\n')
    with pytest.raises(GatewayConfigError, match=r"\[servers.search\]: rate must be 'N/s', 'N/min' or 'N/h'"):
        load_config(config)
