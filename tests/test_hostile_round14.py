"""Hostile round 14: the governor (hostile settings, places given back, retries),
background tasks (their records, their ttl, cancel racing completion) and decisions
through a session's transcript.

What broke, each fixed in ``rho_actors/``:

- an interrupt (a signal handler's ``KeyboardInterrupt``) as a *governed* call's
  isolation started it kept the call's concurrency place for good: a tool with
  ``max_concurrency=1`` was ``unavailable`` for every later call of every session; a
  retry whose start raised left its call without an answer (its turn waited its whole
  bound) and its place taken;
- ``RetryPolicy.total_s`` was ignored by the governor: ``total_s=0`` still ran all 50
  attempts of a failing idempotent call;
- a rate whose N is too large for a float (``"999...9/s"``, 400 digits) raised
  ``OverflowError`` (not the documented ``ValueError``), which a class tool's
  ``rate_limit()`` answer passed on to its registration (its declaration failed instead
  of "a bad answer means no bound"); one so small that the time between two tokens
  overflowed would have raised as a call was refused (``wait_ms`` infinite);
- a call cancelled while it waited for its rate token (or for a place after taking one)
  kept the token: one session queueing calls over a tool's rate and cancelling them left
  other sessions' calls waiting for tokens nobody used (refused ``rate_limited`` 180 s
  away where 60 s was right);
- a session stopped while a call held its own place (``max_concurrency_per_session``, its
  exclusive place) left that gate in the governor for good (a loop's stop forgets the
  session before it cancels its calls, so the gate was never free then);
- a task record nested past the JSON parser's depth raised ``RecursionError`` out of
  ``records.read_all`` (documented never to raise for what is in the folder): the
  session's tasks could not be listed and every background call of it failed;
- an ended task's ``task_ttl_s`` was counted on the wall clock: the clock set forward (NTP,
  a VM resumed) forgot a task that had just ended, its result with it; and only a host
  listing or fetching tasks ever forgot one: ended tasks piled up without bound (a record
  file and about 2 KiB each, 141 a second of one session measured) for as long as an
  agent loop ran;
- a prompt made right after the next host started a session whose calls were decided
  meanwhile (``rho-actors approve`` while no host ran), before that host had acted on the
  decisions (on a pool thread), said "2 call(s) wait for a decision: decide them first"
  (3 runs in 10), and deciding one again was refused "decided already".

What held is kept as tests below: hostile governor, retry and task settings refused
naming the setting, one session's budgets untouched by another's, a non-idempotent call
never retried, a call cancelled in its retry backoff answered at once with its place
free, a task's result fetched twice, cancels racing completions, and decisions on a
transcript with a torn last line, with hostile text, or with a FIFO or symlink in place
of the transcript or the session's folder.

Measured, not kept as tests: an idempotent process tool crashing at every attempt with
no backoff (``RetryPolicy(attempts=10**6, initial_s=0, ...)``) ran 70 to 1,136 attempts
within its one deadline (4 s plus the 10 s start bound), the worker pool within its caps
(48 workers at the peak of 94) and another session's call served meanwhile (0.4-1.3 s).
"""

from __future__ import annotations

import os
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rho_actors import (
    ActorSystem,
    GovernorSettings,
    Reply,
    RetryPolicy,
    ScriptedModel,
    TaskSettings,
    ToolCall,
    ToolFailure,
    tool,
)
from rho_actors.agent.transcript import TRANSCRIPT_NAME, TranscriptError, load
from rho_actors.budgets import ResultBudgets
from rho_actors.cancel import CancelToken
from rho_actors.declarations.policy import call_policy, parse_rate, policy_from_answers
from rho_actors.loop.decisions import ApprovalError, decide
from rho_actors.otp import threads as threads_module
from rho_actors.tasks import records
from rho_actors.tasks import registry as registry_module

from .conftest import WAIT_S, wait_for

pytestmark = pytest.mark.timeout(120)

RUNS: list[str] = []
release = threading.Event()


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    RUNS.clear()
    release.clear()
    yield
    release.set()


@tool(max_concurrency=1, timeout_ms=2_000)
def capped(x: int) -> str:
    """A tool one call of which runs at a time in the whole system."""
    return f"x={x}"


@tool(idempotent=True, max_concurrency=1, timeout_ms=int(WAIT_S * 1000),
      retry=RetryPolicy(attempts=3, initial_s=0, max_wait_s=0, jitter_s=0))
def flaky_once(x: int) -> str:
    """Fail retryably at its first run, then answer."""
    RUNS.append(f"flaky_once {x}")
    if len(RUNS) == 1:
        raise ToolFailure("raised", "busy upstream", retryable=True)
    return f"x={x}"


@tool(idempotent=True, timeout_ms=int(WAIT_S * 1000),
      retry=RetryPolicy(attempts=50, initial_s=0, max_wait_s=0, jitter_s=0, total_s=0.0))
def never_again(x: int) -> str:
    """Always fail retryably; its policy allows no retry after 0 s."""
    RUNS.append(f"never_again {x}")
    raise ToolFailure("raised", "busy upstream", retryable=True)


@tool(timeout_ms=int(WAIT_S * 1000))
def not_idempotent(x: int) -> str:
    """Fail 'retryably', but the tool is not idempotent: never run again."""
    RUNS.append(f"not_idempotent {x}")
    raise ToolFailure("raised", "busy upstream", retryable=True)


@tool(max_calls=2)
def twice(x: int) -> str:
    """At most two calls in a session."""
    return f"x={x}"


@tool(background=True, background_timeout_ms=int(2 * WAIT_S * 1000))
def crawl(site: str) -> str:
    """Wait until the test lets it finish."""
    release.wait(WAIT_S)
    return f"crawled {site}"


@tool(requires_approval=True)
def delete(path: str) -> str:
    """Delete a file (held for a decision)."""
    RUNS.append(f"delete {path}")
    return f"deleted {path}"


@pytest.fixture
def system(tmp_path: Path) -> Iterator[ActorSystem]:
    with ActorSystem(data_dir=tmp_path / "data", shutdown_ms=2_000) as system:
        for one in (capped, flaky_once, never_again, not_idempotent, twice, crawl):
            system.register(one)
        yield system


def _call(call_id: str, name: str, arguments: str = '{"x": 1}') -> ToolCall:
    return ToolCall(call_id, name, arguments)


# --- the governor: places given back ------------------------------------------------------------


def test_an_interrupt_as_a_governed_calls_isolation_starts_it_gives_its_place_back(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``running`` stayed ``{"capped": 1}`` for good, and every later call of
    ``capped`` waited its whole deadline for the place, then was ``unavailable``."""
    loop = system.start_loop("s")

    def submit(self: threads_module.ThreadPool, *args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    for i in range(2):
        monkeypatch.setattr(threads_module.ThreadPool, "submit", submit)
        with pytest.raises(KeyboardInterrupt):
            loop.run_turn([_call(f"c{i}", "capped")])
        monkeypatch.undo()
        assert system.stats()["governor"]["running"]["capped"] == 0
    other = system.start_loop("other")
    [result] = other.run_turn([_call("after", "capped", '{"x": 2}')])
    assert result.ok and result.content == "x=2", result


def test_a_retry_whose_start_raises_is_answered_not_started_and_gives_its_place_back(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the retry's start raised on the governor's pooled thread: the call never
    had an answer (``run_turn`` raised ``TimeoutError`` after its whole bound, 70 s here)
    and ``flaky_once`` kept its one place for good."""
    isolation: Any = system._runtime.isolations["thread"]
    real = isolation.start
    starts: list[str] = []

    def start(spec: Any) -> Any:
        starts.append(spec.call_id)
        if len(starts) == 2:  # the retry
            raise RuntimeError("the isolation broke")
        return real(spec)

    monkeypatch.setattr(isolation, "start", start)
    loop = system.start_loop("s")
    [result] = loop.run_turn([_call("c1", "flaky_once")])
    assert result.error_kind == "cancelled" and result.content == (
        "the call did not start: RuntimeError: the isolation broke"), result
    assert result.details is not None and result.details["attempts"] == 2
    assert system.stats()["governor"]["running"]["flaky_once"] == 0
    [again] = loop.run_turn([_call("c2", "flaky_once", '{"x": 2}')])
    assert again.ok and again.content == "x=2", again


# --- the governor: retries ---------------------------------------------------------------------


def test_no_retry_starts_later_than_the_policys_total_s(system: ActorSystem) -> None:
    """Before: ``total_s`` was read by the model providers' retries only: this call ran
    its 50 attempts."""
    [result] = system.start_loop("s").run_turn([_call("c1", "never_again")])
    assert result.error_kind == "raised" and RUNS == ["never_again 1"]
    assert result.details is None or "attempts" not in result.details, result.details


def test_a_call_of_a_tool_that_is_not_idempotent_is_never_retried_even_when_it_says_retryable(
        system: ActorSystem) -> None:
    [result] = system.start_loop("s").run_turn([_call("c1", "not_idempotent")])
    assert result.error_kind == "raised" and RUNS == ["not_idempotent 1"]
    assert system.stats()["governor"]["retried"] == 0


# --- the governor: hostile settings --------------------------------------------------------------


@pytest.mark.parametrize("text", ["9" * 400 + "/s", "1" + "0" * 400 + "/min", "0." + "0" * 310 + "1/h"],
                         ids=["N overflows", "N overflows per minute", "a token never comes"])
def test_a_rate_no_float_can_hold_is_a_value_error_naming_it(text: str) -> None:
    """Before: ``OverflowError`` (the first two); the last parsed, and its first refusal
    would have raised computing an infinite ``wait_ms``."""
    with pytest.raises(ValueError, match="N must be a finite number"):
        parse_rate(text)
    with pytest.raises(ValueError, match="N must be a finite number"):
        call_policy(rate=text)
    warned: list[str] = []
    policy = policy_from_answers({"rate_limit": text, "max_calls": 3}, lambda name, _answer, problem: warned.append(
        f"{name}: {problem}"))
    assert policy.rate is None and policy.max_calls == 3  # a bad answer: no bound, the others kept
    assert len(warned) == 1 and warned[0].startswith("rate_limit: rate ")


def test_the_smallest_and_largest_rates_a_float_holds_still_work() -> None:
    assert 0 < parse_rate("0." + "0" * 300 + "1/h").per_s < 1e-300
    huge = parse_rate("1" + "0" * 300 + "/s")
    assert huge.per_s == 1e300 and huge.burst == int(1e300)


@pytest.mark.parametrize("make", [
    lambda: GovernorSettings(max_thread_calls=float("nan")),  # type: ignore[arg-type]
    lambda: GovernorSettings(max_thread_calls=float("inf")),  # type: ignore[arg-type]
    lambda: GovernorSettings(max_calls_per_session=0),
    lambda: GovernorSettings(max_repeats=True),
    lambda: GovernorSettings(max_calls_per_session="10"),  # type: ignore[arg-type]
    lambda: RetryPolicy(attempts=True),
    lambda: RetryPolicy(initial_s=float("nan")),
    lambda: RetryPolicy(jitter_s=-1e-9),
    lambda: RetryPolicy(total_s=float("nan")),
    lambda: TaskSettings(task_ttl_s=float("nan")),
    lambda: TaskSettings(max_tasks=10.5),  # type: ignore[arg-type]
    lambda: ResultBudgets(per_turn=float("inf")),  # type: ignore[arg-type]
    lambda: ResultBudgets(per_session=True),
    lambda: call_policy(max_concurrency=float("inf")),
    lambda: call_policy(max_calls=-1),
    lambda: call_policy(background_timeout_ms=float("nan")),
], ids=["threads nan", "threads inf", "calls 0", "repeats True", "calls str", "attempts True", "initial nan",
        "jitter negative", "total nan", "ttl nan", "max_tasks float", "turn bytes inf", "session bytes True",
        "concurrency inf", "max_calls negative", "background timeout nan"])
def test_hostile_settings_are_refused_naming_the_setting(make: Any) -> None:
    with pytest.raises((TypeError, ValueError)) as raised:
        make()
    assert any(word in str(raised.value) for word in (
        "max_thread_calls", "max_calls_per_session", "max_repeats", "attempts", "initial_s", "jitter_s", "total_s",
        "task_ttl_s", "max_tasks", "max_turn_result_bytes", "max_session_result_bytes", "max_concurrency",
        "max_calls", "background_timeout_ms")), raised.value


def test_a_sessions_own_bounds_of_the_wrong_kind_are_refused_naming_them(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, governor=GovernorSettings(max_calls_per_session=5)) as system:
        bads: tuple[tuple[Any, type[Exception]], ...] = (
            (float("nan"), TypeError), (True, TypeError), (0, ValueError), (6, ValueError))
        for bad, error in bads:
            with pytest.raises(error, match="max_calls_per_session"):
                system.start_loop("s", max_calls_per_session=bad)
        with pytest.raises(ValueError, match="max_repeats"):
            system.start_loop("s", max_repeats=-3)


def test_huge_but_finite_bounds_are_bounds_not_errors(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, governor=GovernorSettings(max_thread_calls=10 ** 30,
                                                                  max_calls_per_session=10 ** 30)) as system:
        system.register(twice)
        [result] = system.start_loop("s").run_turn([_call("c1", "twice")])
        assert result.ok, result


# --- the governor: sessions apart --------------------------------------------------------------


def test_one_session_exhausting_its_budgets_leaves_anothers_whole(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, governor=GovernorSettings(max_calls_per_session=3, max_repeats=1)) as system:
        system.register(twice)
        greedy, other = system.start_loop("greedy"), system.start_loop("other")
        results = greedy.run_turn([_call(f"g{i}", "twice", f'{{"x": {i}}}') for i in range(5)])
        assert [r.error_kind for r in results] == [None, None, "budget_exhausted", "budget_exhausted",
                                                   "budget_exhausted"]
        [repeat] = greedy.run_turn([_call("g9", "twice", '{"x": 0}')])
        assert repeat.error_kind == "budget_exhausted"
        mine = other.run_turn([_call("o1", "twice", '{"x": 0}'), _call("o2", "twice", '{"x": 1}')])
        assert [r.error_kind for r in mine] == [None, None], mine


# --- background tasks ---------------------------------------------------------------------------


def test_a_task_record_nested_past_the_parsers_depth_is_skipped_and_the_session_goes_on(
        system: ActorSystem) -> None:
    """Before: ``RecursionError`` out of ``records.read_all``: ``loop.tasks()`` raised,
    and so did every background call of the session."""
    loop = system.start_loop("s1")
    folder = loop.data_dir / records.FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"t_{'a' * 32}.json").write_text("[" * 200_000 + "]" * 200_000)
    assert records.read_all(loop.data_dir) == []
    assert loop.tasks() == []
    release.set()
    [ack] = loop.run_turn([ToolCall("c1", "crawl", '{"site": "a"}')])
    assert ack.ok, ack
    info = loop.task_result(ack.details["task_id"], timeout_s=WAIT_S)
    assert info.status == "completed" and info.result is not None and info.result.content == "crawled a"


def test_the_wall_clock_set_forward_forgets_no_task_that_just_ended(
        system: ActorSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``task_ttl_s`` (1 h) was counted with ``time.time()``: set two hours
    forward, the task that ended a moment ago was forgotten, its result with it."""
    loop = system.start_loop("s1")
    release.set()
    [ack] = loop.run_turn([ToolCall("c1", "crawl", '{"site": "a"}')])
    task_id = ack.details["task_id"]
    assert loop.task_result(task_id, timeout_s=WAIT_S).status == "completed"
    ahead = types.SimpleNamespace(time=lambda: time.time() + 7_200, monotonic=time.monotonic)
    monkeypatch.setattr(registry_module, "time", ahead)  # the registry's clock only
    [info] = loop.tasks()
    assert info.task_id == task_id and info.result is not None and info.result.content == "crawled a"
    monkeypatch.undo()


def test_a_task_ended_before_this_host_started_is_forgotten_after_what_is_left_of_its_ttl(tmp_path: Path) -> None:
    """A task read from its record counts its age by the wall clock once, when it is read."""
    session = tmp_path / "sessions" / "s1"
    old = {"task_id": f"t_{'1' * 32}", "call_id": "c1", "name": "crawl", "session_id": "s1", "status": "completed",
           "started": time.time() - 7_300, "finished": time.time() - 7_200, "delivered": True,
           "result": {"ok": True, "content": "done", "error_kind": None, "duration_ms": 1.0}}
    fresh = {**old, "task_id": f"t_{'2' * 32}", "call_id": "c2", "started": time.time(), "finished": time.time()}
    records.write(session, old)
    records.write(session, fresh)
    with ActorSystem(data_dir=tmp_path) as system:
        assert [info.task_id for info in system.start_loop("s1").tasks()] == [fresh["task_id"]]


def test_a_tasks_result_fetched_twice_is_the_same_and_a_cancel_after_it_changes_nothing(
        system: ActorSystem) -> None:
    loop = system.start_loop("s1")
    release.set()
    [ack] = loop.run_turn([ToolCall("c1", "crawl", '{"site": "a"}')])
    task_id = ack.details["task_id"]
    first = loop.task_result(task_id, timeout_s=WAIT_S)
    second = loop.task_result(task_id, timeout_s=WAIT_S)
    assert first == second and first.status == "completed"
    cancelled = loop.cancel_task(task_id)
    assert cancelled.status == "completed" and cancelled.result == first.result
    assert system.stats()["tasks"]["cancelled"] == 0


def test_cancels_racing_completions_end_each_task_once(system: ActorSystem) -> None:
    loop = system.start_loop("s1")
    acks = loop.run_turn([ToolCall(f"c{i}", "crawl", f'{{"site": "{i}"}}') for i in range(12)])
    ids = [ack.details["task_id"] for ack in acks]
    go = threading.Barrier(2)

    def cancel_all() -> None:
        go.wait(WAIT_S)
        for task_id in ids:
            loop.cancel_task(task_id)

    canceller = threading.Thread(target=cancel_all)
    canceller.start()
    go.wait(WAIT_S)
    release.set()
    canceller.join(WAIT_S)
    infos = [loop.task_result(task_id, timeout_s=WAIT_S) for task_id in ids]
    for info in infos:
        assert info.status in ("completed", "cancelled"), info
        assert info.result is not None and info.result.ok == (info.status == "completed"), info
    stats = system.stats()["tasks"]
    assert stats["open"] == 0 and stats["completed"] + stats["cancelled"] == len(ids), stats
    assert {r["task_id"]: r["status"] for r in records.read_all(loop.data_dir)} == {
        info.task_id: info.status for info in infos}


# --- decisions through the transcript -------------------------------------------------------------


def _pending_session(data: Path) -> Path:
    """A session ``s1`` whose transcript holds calls c1 and c2 of ``delete`` waiting for a
    decision, its host stopped; the transcript's path."""
    with ActorSystem(data_dir=data, shutdown_ms=2_000) as system:
        system.register(delete)
        result = system.start_loop("s1").prompt("clean up", model=ScriptedModel([Reply(tool_calls=(
            ToolCall("c1", "delete", '{"path": "/a"}'), ToolCall("c2", "delete", '{"path": "/b"}')))]))
        assert [p.call_id for p in result.pending] == ["c1", "c2"]
    return data / "sessions" / "s1" / TRANSCRIPT_NAME


def test_a_decision_after_a_torn_last_line_is_recorded_and_acted_on_by_the_next_host(tmp_path: Path) -> None:
    data = tmp_path / "data"
    transcript = _pending_session(data)
    with open(transcript, "ab") as file:  # a host killed mid-write
        file.write(b'{"v": 2, "seq": 99, "type": "call", "st')
    decide(data, "s1", "c1", "approved", decided_by="bob")
    decide(data, "s1", "c2", "rejected", message="keep \udcff it", decided_by="ev\udcfeil\nname")  # hostile text
    history = load(transcript)
    assert history.calls["c1"].state == "decided" and history.calls["c2"].state == "decided"
    assert history.calls["c2"].states["decided"]["message"] == "keep \ufffd it"
    with ActorSystem(data_dir=data, shutdown_ms=2_000) as system:
        system.register(delete)
        system.start_loop("s1")
        assert wait_for(lambda: all(load(transcript).calls[c].state == "settled" for c in ("c1", "c2")))
    assert RUNS == ["delete /a"]
    with pytest.raises(ApprovalError, match="decided already: it was approved by bob"):
        decide(data, "s1", "c1", "rejected", message="too late")


def test_a_fifo_or_symlink_in_place_of_a_transcript_or_session_folder_is_refused_at_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    transcript = _pending_session(data)
    sessions = data / "sessions"
    os.symlink(sessions / "s1", sessions / "evil")  # another session's folder, reached through a link
    (sessions / "s2").mkdir()
    os.symlink(transcript, sessions / "s2" / TRANSCRIPT_NAME)
    (sessions / "s3").mkdir()
    os.mkfifo(sessions / "s3" / TRANSCRIPT_NAME)  # reading it would block for good
    for session, what in (("evil", "is a symlink or not a folder"), ("s2", "is a symlink, not a regular file"),
                          ("s3", "is a FIFO, not a regular file")):
        began = time.monotonic()
        with pytest.raises(TranscriptError, match=what):
            decide(data, session, "c1", "approved")
        assert time.monotonic() - began < WAIT_S
    assert load(transcript).calls["c1"].state == "pending"


def test_a_prompt_before_the_next_host_acted_on_decisions_made_meanwhile_never_says_decide_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before (3 runs in 10 without holding anything back): ``prompt(None)`` at once after
    the next host's ``start_loop`` said "2 call(s) wait for a decision: decide them first"
    of calls decided already (deciding one again is refused "decided already")."""
    from rho_actors.loop.approvals import SessionApprovals

    data = tmp_path / "data"
    transcript = _pending_session(data)
    decide(data, "s1", "c1", "approved", decided_by="bob")
    held_back: list[Any] = []
    real = SessionApprovals._later

    def later(self: SessionApprovals, job: Any, what: str) -> bool:
        if what in ("act", "sync"):  # the host acts on decisions (found at its start, or by a look) after the prompts
            held_back.append(job)
            return True
        return real(self, job, what)

    monkeypatch.setattr(SessionApprovals, "_later", later)
    with ActorSystem(data_dir=data, shutdown_ms=2_000) as system:
        system.register(delete)
        loop = system.start_loop("s1")
        early = loop.prompt(None, model=ScriptedModel([Reply(text="never sent")]))
        assert early.error is not None and "decide them first" in early.error
        assert early.error.startswith("1 call(s) wait for a decision") and "c2 (delete)" in early.error
        assert "call(s) c1 (delete: approved, not run yet) were decided and are being acted on" in early.error
        decide(data, "s1", "c2", "rejected", message="keep /b")
        stalled = loop.prompt(None, model=ScriptedModel([Reply(text="never sent")]))
        assert stalled.error is not None and "decide them first" not in stalled.error, stalled.error
        assert stalled.error.startswith("call(s) c1 (delete: approved, not run yet), c2 (delete: rejected, not run "
                                        "yet) were decided and are being acted on")
        assert held_back
        monkeypatch.undo()  # the host acts on decisions again: the jobs held back run, a later look's at once

        def acted_on() -> bool:
            while held_back:
                held_back.pop(0)()
            return all(load(transcript).calls[c].state == "settled" for c in ("c1", "c2"))

        assert wait_for(acted_on)
        final = loop.prompt(None, model=ScriptedModel([Reply(text="done")]))
        assert final.error is None and final.text == "done"
    assert RUNS == ["delete /a"]


def test_a_session_making_background_calls_without_end_keeps_a_bounded_number_of_ended_tasks(
        tmp_path: Path) -> None:
    """Before: every ended task stayed, in memory (about 2 KiB) and as a record file, until
    its ttl (1 h), and only a host listing or fetching tasks ever forgot one (an agent
    loop's prompts never did): 141 tasks a second of one session measured (load 7.7), and
    each new background call counted the session's open tasks over all of them."""
    settings = TaskSettings(max_ended_tasks_per_session=3)
    with ActorSystem(data_dir=tmp_path, tasks=settings) as system:
        system.register(crawl)
        loop = system.start_loop("s1")
        release.set()
        ids = []
        for i in range(8):
            [ack] = loop.run_turn([ToolCall(f"c{i}", "crawl", f'{{"site": "{i}"}}')])
            ids.append(ack.details["task_id"])
            assert loop.task_result(ids[-1], timeout_s=WAIT_S).status == "completed"
            on_disk = {r["task_id"] for r in records.read_all(loop.data_dir)}
            assert on_disk == set(ids[-4:]), (i, on_disk)  # the 3 that ended last before it started, and it
        assert [info.task_id for info in loop.tasks()] == ids[-4:]
        assert system.stats()["tasks"]["max_ended_tasks_per_session"] == 3


def test_the_ttl_forgets_ended_tasks_of_a_session_whose_host_never_lists_them(tmp_path: Path) -> None:
    with ActorSystem(data_dir=tmp_path, tasks=TaskSettings(task_ttl_s=0)) as system:
        system.register(crawl)
        loop = system.start_loop("s1")
        registry = system._runtime.tasks
        release.set()
        [first] = loop.run_turn([ToolCall("c1", "crawl", '{"site": "a"}')])
        assert registry._sessions["s1"][first.details["task_id"]].done.wait(WAIT_S)  # ended; the host looks not
        [second] = loop.run_turn([ToolCall("c2", "crawl", '{"site": "b"}')])
        assert first.details["task_id"] not in {r["task_id"] for r in records.read_all(loop.data_dir)}
        assert second.ok


@pytest.mark.parametrize("bad", [
    {"max_output_chars": -5}, {"max_output_chars": float("nan")}, {"max_argument_depth": -1},
    {"abandoned_threads_per_tool": -1}, {"max_restarts": -1}, {"worker_idle_s": float("nan")},
    {"max_seconds": float("inf")}, {"governor": {"max_thread_calls": 3}}, {"tasks": {"max_tasks": 3}},
    {"max_turn_result_bytes": float("nan")}, {"max_timeout_ms": float("inf")},
], ids=lambda bad: next(iter(bad)) + "=" + repr(next(iter(bad.values()))))
def test_a_hostile_system_setting_is_refused_naming_it_and_nothing_is_left_running(
        tmp_path: Path, bad: dict[str, Any]) -> None:
    """Before: ``max_output_chars=-5`` let every result through uncut, ``NaN`` failed every
    call ``raised``, ``max_argument_depth=-1`` and ``abandoned_threads_per_tool=-1``
    refused every call, a ``dict`` of task settings was taken and failed the first
    background call and ``stop()`` with an ``AttributeError``, one of governor settings
    failed with one; a refused setting left a thread of the half-made system running."""
    name = next(iter(bad))
    before = set(threading.enumerate())
    with pytest.raises((TypeError, ValueError), match=name):
        ActorSystem(data_dir=tmp_path, **bad)
    assert set(threading.enumerate()) <= before


class Metered:
    """One call a minute in the whole system, shared by every tool of its rate group."""

    def __init__(self, name: str, timeout_ms: int) -> None:
        self._name, self._timeout_ms = name, timeout_ms

    def name(self) -> str:
        return self._name

    @staticmethod
    def description() -> str:
        return "Use the metered service."

    @staticmethod
    def parameter_schema() -> dict[str, Any]:
        return {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}

    def timeout_ms(self) -> int:
        return self._timeout_ms

    @staticmethod
    def rate_limit() -> str:
        return "1/min"

    @staticmethod
    def rate_group() -> str:
        return "meter"

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        return f"x={args['x']}"


def test_calls_cancelled_while_they_wait_for_their_rate_token_give_it_back(tmp_path: Path) -> None:
    """Before: a cancelled call kept the token it had reserved: one session queueing calls
    over a tool's rate and cancelling them (or stopping) left every other session's call
    waiting for tokens nobody used (here refused ``rate_limited`` with its token 180 s
    away, where 60 s is right)."""
    with ActorSystem(data_dir=tmp_path) as system:
        system.register(Metered("metered", 300_000))
        system.register(Metered("metered_soon", 30_000))  # a deadline shorter than a token's wait
        greedy, other = system.start_loop("greedy"), system.start_loop("other")
        [first] = greedy.run_turn([_call("g0", "metered")])  # the bucket's one token
        assert first.ok
        bucket = system._runtime.governor._buckets["group:meter"]
        cancel = CancelToken()
        queued = greedy.submit_turn([_call(f"g{i}", "metered", f'{{"x": {i}}}') for i in (1, 2)], cancel=cancel)
        assert wait_for(lambda: bucket.tokens(time.monotonic()) < -1.9)  # both reserved: at +60 s and +120 s
        cancel.cancel()
        assert [r.error_kind for r in queued.result(WAIT_S)] == ["cancelled", "cancelled"]
        [refused] = other.run_turn([_call("o1", "metered_soon")])
        assert refused.error_kind == "rate_limited", refused
        wait_ms = int(refused.content.split("only in ")[1].split(" ms")[0])
        assert wait_ms <= 60_000, refused.content


@tool(idempotent=True, max_concurrency=1, timeout_ms=int(WAIT_S * 1000),
      retry=RetryPolicy(attempts=3, initial_s=WAIT_S / 4, max_wait_s=WAIT_S / 4, jitter_s=0))
def backs_off(x: int) -> str:
    """Fail retryably at its first run (the retry waits a quarter of WAIT_S), then answer."""
    RUNS.append(f"backs_off {x}")
    if x == 1:
        raise ToolFailure("raised", "busy upstream", retryable=True)
    return f"x={x}"


def test_a_call_cancelled_in_its_retry_backoff_is_answered_at_once_runs_no_more_and_holds_no_place(
        system: ActorSystem) -> None:
    system.register(backs_off)
    loop = system.start_loop("s")
    cancel = CancelToken()
    future = loop.submit_turn([_call("c1", "backs_off")], cancel=cancel)
    assert wait_for(lambda: system.stats()["governor"]["retried"] == 1)  # in its backoff
    cancel.cancel()
    [result] = future.result(WAIT_S / 8)  # answered at once, long before its retry was due
    assert result.error_kind == "cancelled", result
    assert system.stats()["governor"]["running"]["backs_off"] == 0
    [other] = system.start_loop("other").run_turn([_call("o1", "backs_off", '{"x": 2}')])
    assert other.ok and RUNS == ["backs_off 1", "backs_off 2"]


started = threading.Event()  # set by the tools below as they run


@tool(max_concurrency_per_session=1, timeout_ms=int(WAIT_S * 1000))
def one_per_session(x: int) -> str:
    """One call at a time in a session; waits until the test lets it end (its thread runs on
    past a cancel: a thread call cannot be stopped)."""
    started.set()
    release.wait(WAIT_S)
    return f"x={x}"


@tool(concurrency="exclusive", timeout_ms=int(WAIT_S * 1000))
def exclusive_wait(x: int) -> str:
    """An exclusive tool: one of its session's exclusive calls at a time."""
    started.set()
    release.wait(WAIT_S)
    return f"x={x}"


@pytest.mark.parametrize("name", ["one_per_session", "exclusive_wait"])
def test_a_session_stopped_while_a_call_holds_its_own_place_leaves_no_place_behind(
        system: ActorSystem, name: str) -> None:
    """Before: a session's per-session gate (``max_concurrency_per_session``, its exclusive
    place) was dropped at its loop's stop only when free, and a loop's stop always finds
    its running calls still in them (they are cancelled after): one gate kept for good for
    each session stopped with such a call, in a host serving sessions without end."""
    started.clear()
    system.register(one_per_session)
    system.register(exclusive_wait)
    governor: Any = system._runtime.governor
    loop = system.start_loop("gone")
    future = loop.submit_turn([_call("c1", name)])
    assert started.wait(WAIT_S)
    loop.stop()
    assert [r.error_kind for r in future.result(WAIT_S)] == ["cancelled"]
    release.set()  # (its gate is kept until its call answers: the bound holds should the session come back)
    assert wait_for(lambda: not governor.gates.orphans)
    assert governor.gates.per_session == {} and governor.gates.exclusive == {}
    started.clear()
    [again] = system.start_loop("gone").run_turn([_call("c2", name, '{"x": 2}')])
    assert again.ok, again


def test_a_session_back_while_its_stopped_call_runs_keeps_its_exclusive_place_one(system: ActorSystem) -> None:
    """A session stopped while its exclusive call runs, then started again under its id:
    its next exclusive call waits for the stopped one's thread (its place is the same one,
    no longer an orphan), runs once it ends, and the place is dropped at the session's
    second stop. (A per-session place kept aside from its gate would let two run at once.)"""
    started.clear()
    system.register(exclusive_wait)
    governor: Any = system._runtime.governor
    first = system.start_loop("back")
    future = first.submit_turn([_call("c1", "exclusive_wait")])
    assert started.wait(WAIT_S)
    first.stop()
    assert [r.error_kind for r in future.result(WAIT_S)] == ["cancelled"]
    started.clear()
    again = system.start_loop("back")
    waiting = again.submit_turn([_call("c2", "exclusive_wait", '{"x": 2}')])
    assert wait_for(lambda: governor.waiting.count == 1)  # behind the stopped call's thread, in its one place
    assert not started.is_set() and not governor.gates.orphans
    release.set()
    [done] = waiting.result(WAIT_S)
    assert done.ok and done.content == "x=2", done
    again.stop()
    assert wait_for(lambda: governor.gates.exclusive == {} and governor._exclusive == {})
