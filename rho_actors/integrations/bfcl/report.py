"""The report of a BFCL replay (internal to :mod:`rho_actors.integrations.bfcl`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = [
    "Difference",
    "Rejection",
    "ReplayReport",
    "StateDifference",
]

# --------------------------------------------------------------------------- report


@dataclass(frozen=True, slots=True)
class Rejection:
    """A call the runtime refused before running it, as the data made it do.

    ``kind`` is ``"invalid_arguments"`` (the arguments failed the tool's schema) or
    ``"withheld"`` (BFCL's ground truth calls a function BFCL itself holds out at that
    turn); ``reason`` is the runtime's message; ``expected`` what direct execution gave.
    """

    entry_id: str
    turn: int
    call: str
    kind: str
    reason: str
    expected: str


@dataclass(frozen=True, slots=True)
class Difference:
    """A call whose runtime result differs from direct execution (or could not be made)."""

    entry_id: str
    turn: int
    call: str
    expected: str
    got: str
    expected_ok: bool
    got_ok: bool
    error_kind: str | None


@dataclass(frozen=True, slots=True)
class StateDifference:
    """A backend instance whose public state differs at the end of a session.

    ``attributes`` names the differing attributes; ``attributed_to_rejection`` is true
    when the session had a listed rejection (the refused call ran in direct execution
    only, so the states are expected to part)."""

    entry_id: str
    class_name: str
    attributes: tuple[str, ...]
    attributed_to_rejection: bool


def _percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class ReplayReport:
    """The outcome of :func:`replay` for one category, with its backends in one
    ``isolation`` (``"thread"``, ``"process"`` or ``"ray"``).

    Counts: ``sessions`` (entries), ``turns`` (ground-truth turns, empty ones included),
    ``calls`` (ground-truth calls), ``identical`` (calls whose runtime result has the
    same text and the same ok/error status as direct execution). ``rejections`` are the
    listed refusals the data causes; ``differences`` every other mismatch;
    ``sessions_identical_state`` counts sessions whose every instance ends in the same
    public state as direct execution's; ``state_differences`` lists the others.

    Times: ``replay_wall_s`` is the sum over turns of the wall time of
    ``loop.run_turn`` (seconds); ``direct_wall_s`` the sum over calls of the direct
    method call plus BFCL formatting (seconds). Whole sessions:
    ``replay_sessions_wall_s`` adds to the turns each session's set-up and tear-down
    through the runtime (starting its backends server, which builds the instances where
    it runs, ``start_loop``, ``set_withheld``, ``loop.stop``, reading the server's states
    and stopping it); ``direct_sessions_wall_s`` adds to the direct calls
    the building of the direct instances, which is all direct execution needs.
    ``total_wall_s`` is the whole replay (loading data, registering tools, both sides,
    the comparisons, system start and stop).

    Per-call overhead, in microseconds, for each call the runtime ran (refused calls
    excluded): ``overhead_us`` = the call's wall time in the runtime, from its
    ``started`` event (the loop dispatching it to a CallActor) to its ``finished`` event
    (the loop settling its result), both stamped with ``time.perf_counter()`` in the
    loop's thread by a :meth:`ActorSystem.subscribe` callback, minus the direct
    execution time of the same call (method call plus BFCL formatting).
    ``turn_overhead_us`` = (wall time of ``run_turn`` minus the summed direct times of
    the turn's calls) / calls in the turn, assigned to each call of the turn, so it
    also counts the host's round trip, argument decoding and validation. Each is
    summarised as ``{"n", "p50", "p99", "mean"}`` (nearest-rank percentiles).
    """

    category: str
    isolation: str = "thread"
    sessions: int = 0
    turns: int = 0
    calls: int = 0
    identical: int = 0
    rejections: list[Rejection] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    sessions_identical_state: int = 0
    state_differences: list[StateDifference] = field(default_factory=list)
    declaration_failures: list[dict[str, str]] = field(default_factory=list)
    tools_registered: int = 0
    replay_wall_s: float = 0.0
    direct_wall_s: float = 0.0
    replay_sessions_wall_s: float = 0.0
    direct_sessions_wall_s: float = 0.0
    total_wall_s: float = 0.0
    overhead_samples_us: list[float] = field(default_factory=list, repr=False)
    tree: dict[str, Any] | None = field(default=None, repr=False)
    turn_overhead_samples_us: list[float] = field(default_factory=list, repr=False)

    @property
    def unexplained_state_differences(self) -> list[StateDifference]:
        """State differences not attributed to a listed rejection."""
        return [d for d in self.state_differences if not d.attributed_to_rejection]

    @property
    def exit_code(self) -> int:
        """0 when every result and state matched except for listed rejections (and every
        declaration passed its checks), else 1."""
        clean = not self.differences and not self.unexplained_state_differences and not self.declaration_failures
        return 0 if clean else 1

    @staticmethod
    def _summary(samples: Sequence[float]) -> dict[str, float | int | None]:
        return {
            "n": len(samples),
            "p50": _round(_percentile(samples, 50)),
            "p99": _round(_percentile(samples, 99)),
            "mean": _round(sum(samples) / len(samples)) if samples else None,
        }

    @property
    def overhead_us(self) -> dict[str, float | int | None]:
        """Per-call overhead summary (dispatch to settled result), in microseconds
        (see the class doc)."""
        return self._summary(self.overhead_samples_us)

    @property
    def turn_overhead_us(self) -> dict[str, float | int | None]:
        """Per-call whole-turn overhead summary in microseconds (see the class doc)."""
        return self._summary(self.turn_overhead_samples_us)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON data (the keys of :meth:`to_json`)."""
        return {
            "category": self.category,
            "isolation": self.isolation,
            "sessions": self.sessions,
            "turns": self.turns,
            "calls": self.calls,
            "identical": self.identical,
            "rejected": len(self.rejections),
            "rejections": [asdict(r) for r in self.rejections],
            "different": len(self.differences),
            "differences": [asdict(d) for d in self.differences],
            "sessions_identical_state": self.sessions_identical_state,
            "state_differences": [asdict(d) | {"attributes": list(d.attributes)} for d in self.state_differences],
            "declaration_failures": list(self.declaration_failures),
            "tools_registered": self.tools_registered,
            "replay_wall_s": round(self.replay_wall_s, 6),
            "direct_wall_s": round(self.direct_wall_s, 6),
            "replay_sessions_wall_s": round(self.replay_sessions_wall_s, 6),
            "direct_sessions_wall_s": round(self.direct_sessions_wall_s, 6),
            "total_wall_s": round(self.total_wall_s, 6),
            "overhead_us": self.overhead_us,
            "turn_overhead_us": self.turn_overhead_us,
            "exit_code": self.exit_code,
            **({"tree": self.tree} if self.tree is not None else {}),
        }

    def to_json(self, indent: int | None = None) -> str:
        """The report as one JSON object (text)."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    def render(self) -> RenderableType:
        """A rich renderable of the summary and of every rejection and difference."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        def us(summary: Mapping[str, Any]) -> str:
            if not summary["n"]:
                return "n/a"
            return f"p50 {summary['p50']:.0f} us, p99 {summary['p99']:.0f} us, mean {summary['mean']:.0f} us"

        table = Table(title=f"BFCL multi_turn_{self.category} replay", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        rows = [
            ("isolation of the backends", self.isolation),
            ("sessions", str(self.sessions)),
            ("turns", str(self.turns)),
            ("calls", str(self.calls)),
            ("identical results", f"{self.identical}/{self.calls}"),
            ("rejected (listed below)", str(len(self.rejections))),
            ("other differences", str(len(self.differences))),
            ("sessions with identical state", f"{self.sessions_identical_state}/{self.sessions}"),
            ("replay wall time", f"{self.replay_wall_s:.3f} s (run_turn)"),
            ("direct wall time", f"{self.direct_wall_s:.3f} s"),
            ("replay wall time, whole sessions", f"{self.replay_sessions_wall_s:.3f} s"),
            ("direct wall time, whole sessions", f"{self.direct_sessions_wall_s:.3f} s"),
            ("total wall time", f"{self.total_wall_s:.3f} s"),
            ("overhead per call (dispatch to result)", us(self.overhead_us)),
            ("overhead per call (whole turn)", us(self.turn_overhead_us)),
        ]
        for k, v in rows:
            table.add_row(k, v)
        parts: list[RenderableType] = [table]
        for r in self.rejections:
            parts.append(Text(f"rejected [{r.kind}] {r.entry_id} turn {r.turn}: {r.call}\n  reason: {r.reason}"))
        for d in self.differences:
            parts.append(
                Text(
                    f"DIFFERENT {d.entry_id} turn {d.turn}: {d.call}\n"
                    f"  expected ({'ok' if d.expected_ok else 'error'}): {_clip(d.expected)}\n"
                    f"  got ({'ok' if d.got_ok else d.error_kind}): {_clip(d.got)}",
                    style="red",
                )
            )
        for s in self.state_differences:
            why = "attributed to the rejection in this session" if s.attributed_to_rejection else "UNEXPLAINED"
            parts.append(
                Text(
                    f"state differs {s.entry_id} {s.class_name}: {', '.join(s.attributes)} ({why})",
                    style="" if s.attributed_to_rejection else "red",
                )
            )
        for f in self.declaration_failures:
            parts.append(Text(f"declaration failed {f['name']}: {f['reason']}", style="red"))
        verdict = "OK" if self.exit_code == 0 else "FAILED"
        parts.append(Text(f"{verdict} (exit code {self.exit_code})", style="green" if self.exit_code == 0 else "red"))
        return Group(*parts)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"
