"""The replay itself: BFCL's recorded calls through an ActorSystem, compared with a
direct execution (internal to :mod:`rho_actors.integrations.bfcl`).
"""

from __future__ import annotations

import importlib
import json
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rho_actors.integrations.bfcl.backends import ISOLATIONS, SERVER_DEP, connect, server_name, server_start
from rho_actors.integrations.bfcl.convert import (
    BfclFunction,
    bind_arguments,
    convert_schema,
    execute_direct,
    load_functions,
    make_tools,
    parse_call,
)
from rho_actors.integrations.bfcl.data import (
    BfclEntry,
    CallParseError,
    backend_class,
    build_instances,
    differing_attributes,
    load_entries,
    public_state,
    withheld_for_turn,
)
from rho_actors.integrations.bfcl.report import Difference, Rejection, ReplayReport, StateDifference
from rho_actors.isolation.servers import ServerCall
from rho_actors.otp.supervisor import ChildSpec
from rho_actors.tool import ErrorKind, ToolCall, ToolResult

if TYPE_CHECKING:
    pass

__all__ = [
    "replay",
]

# --------------------------------------------------------------------------- replay


@dataclass(frozen=True, slots=True)
class _PlannedCall:
    call_id: str
    source: str
    name: str
    direct_args: dict[str, Any]
    arguments_json: str


def _plan_call(
    source: str, call_id: str, functions: Mapping[str, BfclFunction], instances: Mapping[str, object]
) -> _PlannedCall:
    parsed = parse_call(source)
    function = functions.get(parsed.name)
    if function is None:
        raise CallParseError(f"{parsed.name!r} is not a function of the multi-turn classes: {source!r}")
    instance = instances.get(function.class_name)
    method = getattr(instance if instance is not None else backend_class(function.class_name)(), parsed.name)
    args = bind_arguments(method, parsed)
    return _PlannedCall(call_id, source, parsed.name, args, json.dumps(args))


def replay(
    category: str = "base",
    limit: int | None = None,
    progress: bool = False,
    *,
    ids: Iterable[str] | None = None,
    withhold_excluded: bool = True,
    data_dir: Path | None = None,
    tree: bool = False,
    isolation: str = "thread",
) -> ReplayReport:
    """Replay the first ``limit`` (all if ``None``) conversations of BFCL's
    ``multi_turn_{category}`` through an :class:`~rho_actors.ActorSystem` and compare.

    One system registers the tools of the 8 multi-turn classes once; each entry is one
    loop (session id = entry id) whose ``deps`` are its backend instances, with the
    withheld set of :func:`withheld_for_turn` updated between turns. Each ground-truth
    turn is one ``run_turn`` of ``ToolCall`` values with JSON-text arguments; each call
    is also executed directly (:func:`execute_direct`) on a second, separate set of
    instances, and at the end of the session the public states are compared.

    ``progress`` shows a rich progress bar on stderr. ``ids`` restricts the replay to
    those entry ids (see :func:`load_entries`). ``data_dir`` is the system's data
    directory (a temporary one if ``None``). ``tree`` keeps the system's supervision
    tree, taken after the last session, in :attr:`ReplayReport.tree`. ``isolation``
    (``"thread"``, ``"process"`` or ``"ray"``) is where each session's backend instances
    live: in a server of that isolation started for the session (a host actor, a
    process of its own, a Ray actor; :mod:`rho_actors.integrations.bfcl.backends`), where
    every call of the session runs and whose states are compared at its end. Returns a :class:`ReplayReport`; raises
    :class:`BfclUnavailableError` when ``bfcl_eval`` is missing and ``ValueError`` for an
    unknown category or isolation.
    """
    if isolation not in ISOLATIONS:
        raise ValueError(f"unknown isolation {isolation!r}; choose one of {', '.join(ISOLATIONS)}")
    started = time.perf_counter()
    entries = load_entries(category, limit, ids)
    functions = load_functions()
    validator_class = importlib.import_module("jsonschema").Draft202012Validator
    validators = {name: validator_class(convert_schema(f.parameters)) for name, f in functions.items()}
    report = ReplayReport(category=category, isolation=isolation)

    from rho_actors import ActorSystem

    connect(isolation)
    with (
        tempfile.TemporaryDirectory(prefix="rho-bfcl-") as tmp,
        ActorSystem(data_dir=data_dir if data_dir is not None else Path(tmp)) as system,
    ):
        clock = _CallClock()
        system.subscribe(clock)
        for tool in make_tools(functions):
            # An explicit origin names the BFCL method in messages (and skips a source lookup).
            origin = (
                f"bfcl_eval {tool.function.class_name}.{tool.function.name} via rho_actors.integrations.bfcl.BfclTool"
            )
            registration = system.register(tool, origin=origin)
            if registration.info is None:
                report.declaration_failures.append({"name": tool.name(), "reason": str(registration.reason)})
            else:
                report.tools_registered += 1
        with _progress_bar(progress, len(entries), category) as advance:
            for entry in entries:
                _Session(system, entry, functions, validators, report, withhold_excluded, clock).run()
                clock.clear()
                advance()
        if tree:
            report.tree = system.tree()
    report.total_wall_s = time.perf_counter() - started
    return report


class _CallClock:
    """Stamps each call's ``started`` and ``finished`` events with ``perf_counter``
    (seconds); called in the loop's thread, as the runtime emits them."""

    def __init__(self) -> None:
        self._started: dict[tuple[str, str], float] = {}
        self._finished: dict[tuple[str, str], float] = {}

    def __call__(self, event: Any) -> None:
        now = time.perf_counter()
        kind, session_id, call_id = (getattr(event, a, None) for a in ("kind", "session_id", "call_id"))
        if kind not in ("started", "finished", "timed_out") or session_id is None or call_id is None:
            return  # not a call's event (a supervisor's, a tool set's...)
        key = (str(session_id), str(call_id))
        if kind == "started":
            self._started[key] = now
        else:
            self._finished[key] = now

    def wall_s(self, session_id: str, call_id: str) -> float | None:
        """Seconds from the call's dispatch to its result, or ``None`` if not seen."""
        key = (session_id, call_id)
        start, end = self._started.get(key), self._finished.get(key)
        return None if start is None or end is None else end - start

    def clear(self) -> None:
        self._started.clear()
        self._finished.clear()


class _NoProgress:
    def __enter__(self) -> Callable[[], None]:
        return lambda: None

    def __exit__(self, *exc: object) -> None:
        return None


class _RichProgress:
    def __init__(self, total: int, category: str) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]replay bfcl {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task = self._progress.add_task(category, total=total)

    def __enter__(self) -> Callable[[], None]:
        self._progress.start()
        return lambda: self._progress.advance(self._task)

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()


def _progress_bar(enabled: bool, total: int, category: str) -> _NoProgress | _RichProgress:
    return _RichProgress(total, category) if enabled else _NoProgress()


def _kind(result: ToolResult) -> str | None:
    return None if result.error_kind is None else str(result.error_kind)


@dataclass(frozen=True, slots=True)
class _Direct:
    text: str
    raised: bool
    elapsed_s: float


class _Session:
    """One entry replayed: a loop over runtime instances, direct execution on a second,
    separate set, the comparison of every result and of the final states."""

    def __init__(
        self,
        system: Any,
        entry: BfclEntry,
        functions: Mapping[str, BfclFunction],
        validators: Mapping[str, Any],
        report: ReplayReport,
        withhold_excluded: bool,
        clock: _CallClock,
    ) -> None:
        self.system, self.entry, self.functions, self.validators = system, entry, functions, validators
        self.report, self.withhold_excluded, self.clock = report, withhold_excluded, clock
        t0 = time.perf_counter()
        self.direct_instances = build_instances(entry)
        report.direct_sessions_wall_s += time.perf_counter() - t0
        self.rejected = False
        self.withheld: set[str] = set()

    def run(self) -> None:
        entry, report = self.entry, self.report
        report.sessions += 1
        self.withheld = self._withheld(0)
        t0 = time.perf_counter()
        name = server_name(entry)  # the session's backends: built in their server, its calls run there
        self.start_error = ""
        try:
            self.system.start_child(ChildSpec(name, server_start(report.isolation, entry), restart="permanent",
                                              name=name))
        except Exception as exc:  # every call then differs (its server is not running), the replay goes on
            self.start_error = f": its start failed ({type(exc).__name__}: {exc})"
        loop = self.system.start_loop(session_id=entry.id, withheld=sorted(self.withheld), deps={SERVER_DEP: name})
        report.replay_sessions_wall_s += time.perf_counter() - t0
        try:
            for turn_index, turn in enumerate(entry.ground_truth):
                report.turns += 1
                withheld = self._withheld(turn_index)
                if withheld != self.withheld:
                    t0 = time.perf_counter()
                    loop.set_withheld(sorted(withheld))
                    report.replay_sessions_wall_s += time.perf_counter() - t0
                    self.withheld = withheld
                if turn:
                    self._turn(loop, turn_index, turn)
        finally:
            t0 = time.perf_counter()
            loop.stop()
            try:
                states = self._states(name)
            finally:
                self.system.stop_child(name)
                report.replay_sessions_wall_s += time.perf_counter() - t0
        self._compare_states(states)

    def _states(self, name: str) -> dict[str, dict[str, Any]] | str:
        """The server's public states by class, or why they could not be read."""
        ref = self.system.whereis(name)
        if ref is None:
            return f"the backends server {name!r} is not running{self.start_error}"
        try:
            states: dict[str, dict[str, Any]] = ref.ask(ServerCall("states"), timeout=60)
        except Exception as exc:
            return f"the backends server {name!r} did not give its states: {type(exc).__name__}: {exc}"
        return states

    def _withheld(self, turn_index: int) -> set[str]:
        return withheld_for_turn(self.entry, turn_index, self.functions, withhold_excluded=self.withhold_excluded)

    def _turn(self, loop: Any, turn_index: int, turn: Sequence[str]) -> None:
        report = self.report
        report.calls += len(turn)
        planned: list[_PlannedCall] = []
        for j, source in enumerate(turn):
            try:
                planned.append(_plan_call(source, f"t{turn_index}c{j}", self.functions, self.direct_instances))
            except CallParseError as exc:
                got = f"unreplayable call: {exc}"
                report.differences.append(Difference(self.entry.id, turn_index, source, "", got, True, False, None))
        if not planned:
            return
        calls = [ToolCall(id=p.call_id, name=p.name, arguments=p.arguments_json) for p in planned]
        t0 = time.perf_counter()
        try:
            results: list[ToolResult] = list(loop.run_turn(calls))
            turn_error: str | None = None
        except Exception as exc:  # a runtime failure: every call of the turn differs
            results = []
            turn_error = f"run_turn raised {type(exc).__name__}: {exc}"
        turn_wall = time.perf_counter() - t0
        report.replay_wall_s += turn_wall
        report.replay_sessions_wall_s += turn_wall

        direct = [self._direct(p) for p in planned]
        by_id = {r.call_id: r for r in results}
        ran: list[_Direct] = []
        for p, d in zip(planned, direct, strict=True):
            result = by_id.get(p.call_id)
            if result is None:
                got = turn_error or f"no result for call id {p.call_id} (results: {[r.call_id for r in results]})"
                report.differences.append(
                    Difference(self.entry.id, turn_index, p.source, d.text, got, not d.raised, False, None)
                )
            elif self._compare(turn_index, p, d, result):
                ran.append(d)
        if ran and turn_error is None:
            per_call = (turn_wall - sum(d.elapsed_s for d in ran)) * 1e6 / len(ran)
            report.turn_overhead_samples_us.extend([per_call] * len(ran))

    def _direct(self, p: _PlannedCall) -> _Direct:
        instance = self.direct_instances[self.functions[p.name].class_name]
        t0 = time.perf_counter()
        text, raised = execute_direct(instance, p.name, p.direct_args)
        elapsed = time.perf_counter() - t0
        self.report.direct_wall_s += elapsed
        self.report.direct_sessions_wall_s += elapsed
        return _Direct(text, raised, elapsed)

    def _compare(self, turn_index: int, p: _PlannedCall, d: _Direct, result: ToolResult) -> bool:
        """Record the outcome of one call; returns whether the runtime ran it."""
        report, entry_id = self.report, self.entry.id
        # Refusals are checked independently: a listed rejection must be one the data
        # causes (arguments failing the converted schema, or a function BFCL holds out at
        # this turn); any other refusal, or running a call whose arguments fail the
        # schema, is a difference.
        schema_ok = self.validators[p.name].is_valid(json.loads(p.arguments_json))
        if (result.error_kind is ErrorKind.INVALID_ARGUMENTS and not schema_ok) or (
            result.error_kind is ErrorKind.WITHHELD and p.name in self.withheld
        ):
            self.rejected = True
            kind = str(result.error_kind)
            report.rejections.append(Rejection(entry_id, turn_index, p.source, kind, result.content, d.text))
            return False
        if not schema_ok and p.name not in self.withheld and result.error_kind is not ErrorKind.INVALID_ARGUMENTS:
            got = f"[the runtime did not refuse arguments that fail the schema] {result.content}"
            report.differences.append(
                Difference(entry_id, turn_index, p.source, d.text, got, not d.raised, result.ok, _kind(result))
            )
            return False
        call_wall = self.clock.wall_s(entry_id, p.call_id)
        if call_wall is not None:
            report.overhead_samples_us.append((call_wall - d.elapsed_s) * 1e6)
        if result.content == d.text and result.ok == (not d.raised):
            report.identical += 1
        else:
            got = result.content
            report.differences.append(
                Difference(entry_id, turn_index, p.source, d.text, got, not d.raised, result.ok, _kind(result))
            )
        return True

    def _compare_states(self, states: dict[str, dict[str, Any]] | str) -> None:
        same = True
        for class_name in self.entry.involved_classes:
            expected = public_state(self.direct_instances[class_name])
            if isinstance(states, str):  # unreadable: the difference is why
                differing = [states]
            else:
                differing = differing_attributes(states.get(class_name, {}), expected)
            if differing:
                same = False
                self.report.state_differences.append(
                    StateDifference(self.entry.id, class_name, tuple(differing), self.rejected)
                )
        if same:
            self.report.sessions_identical_state += 1
