"""Reading BFCL's installed package: its multi-turn entries, backend classes and
constants (internal to :mod:`rho_actors.integrations.bfcl`).
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from rho_actors.errors import RhoError

__all__ = [
    "BFCL_VERSION",
    "BfclFunction",
    "CATEGORIES",
    "ERROR_PREFIX",
    "INSTALL_HINT",
    "MULTI_TURN_CLASSES",
    "BfclEntry",
    "BfclUnavailableError",
    "CallParseError",
    "backend_class",
    "backend_config",
    "bfcl_package",
    "bfcl_root",
    "build_instances",
    "data_file",
    "load_entries",
    "public_state",
    "read_json_lines",
    "state_differences",
    "withheld_for_turn",
]

CATEGORIES: tuple[str, ...] = ("base", "miss_func", "miss_param", "long_context")
"""The BFCL multi-turn categories a replay can run."""

MULTI_TURN_CLASSES: tuple[str, ...] = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)
"""The backend classes of BFCL's multi-turn categories (their function names are unique)."""

BFCL_VERSION = "2026.3.23"
INSTALL_HINT = f"pip install --no-deps bfcl-eval=={BFCL_VERSION} mpmath"
"""The command that installs what a replay needs."""

ERROR_PREFIX = "Error during execution: "
"""BFCL's text for a call that raised: this prefix, then ``str(exception)``."""


@dataclass(frozen=True, slots=True)
class BfclFunction:
    """One BFCL function doc: ``name``, owning backend ``class_name``, ``description``
    and the raw BFCL ``parameters`` block."""

    name: str
    class_name: str
    description: str
    parameters: dict[str, Any]


class BfclUnavailableError(RhoError, RuntimeError):
    """``bfcl_eval`` (or ``mpmath``, which its MathAPI needs) is not installed."""


class CallParseError(RhoError, ValueError):
    """A ground-truth call string is not a plain call with literal arguments, or its
    arguments do not fit the method's signature."""



# --------------------------------------------------------------------------- package


def bfcl_package() -> ModuleType:
    """Import ``bfcl_eval`` (and check ``mpmath``), or raise :class:`BfclUnavailableError`
    naming the install command."""
    try:
        bfcl_eval = importlib.import_module("bfcl_eval")
        importlib.import_module("mpmath")
    except ImportError as exc:
        raise BfclUnavailableError(
            f"the BFCL replay needs the bfcl_eval package and mpmath ({exc}); "
            f"install them with: {INSTALL_HINT}"
        ) from exc
    return bfcl_eval


def bfcl_root() -> Path:
    """The installed ``bfcl_eval`` package directory."""
    return Path(str(bfcl_package().__file__)).parent


def backend_config() -> ModuleType:
    bfcl_package()
    return importlib.import_module("bfcl_eval.constants.executable_backend_config")


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def data_file(directory: Path, category: str) -> Path:
    matches = sorted(directory.glob(f"BFCL_v*_multi_turn_{category}.json"))
    if not matches:
        raise FileNotFoundError(f"no BFCL multi_turn_{category} data in {directory}")
    return matches[-1]


def backend_class(class_name: str) -> type:
    """The BFCL backend class named ``class_name`` (one of :data:`MULTI_TURN_CLASSES`),
    imported from the module BFCL's ``CLASS_FILE_PATH_MAPPING`` names."""
    module_name = backend_config().CLASS_FILE_PATH_MAPPING[class_name]
    cls = getattr(importlib.import_module(module_name), class_name)
    assert isinstance(cls, type)
    return cls



# --------------------------------------------------------------------------- sessions


@dataclass(frozen=True, slots=True)
class BfclEntry:
    """One BFCL multi-turn conversation.

    ``ground_truth[i]`` lists the call strings of turn ``i``; ``missed`` maps a turn
    index to the function names BFCL reveals at that turn (``miss_func``);
    ``excluded`` lists ``excluded_function``; ``long_context`` says whether the
    backends load their long-context scenario.
    """

    id: str
    category: str
    involved_classes: tuple[str, ...]
    initial_config: dict[str, Any]
    ground_truth: tuple[tuple[str, ...], ...]
    excluded: tuple[str, ...] = ()
    missed: dict[int, tuple[str, ...]] = field(default_factory=dict)
    long_context: bool = False


def load_entries(
    category: str = "base", limit: int | None = None, ids: Iterable[str] | None = None
) -> list[BfclEntry]:
    """The entries of a multi-turn ``category`` (one of :data:`CATEGORIES`), in file
    order, each joined with its ground truth from ``bfcl_eval/data/possible_answer``:
    only those whose id is in ``ids`` (when given), then the first ``limit`` (all if
    ``None``). Raises ``ValueError`` for an unknown category or an id not found."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; choose one of {', '.join(CATEGORIES)}")
    data_dir = bfcl_root() / "data"
    rows = read_json_lines(data_file(data_dir, category))
    if ids is not None:
        wanted = set(ids)
        missing = wanted - {row["id"] for row in rows}
        if missing:
            raise ValueError(f"no entry {', '.join(sorted(missing))} in multi_turn_{category}")
        rows = [row for row in rows if row["id"] in wanted]
    if limit is not None:
        rows = rows[: max(0, limit)]
    answer_rows = read_json_lines(data_file(data_dir / "possible_answer", category))
    answers = {row["id"]: row["ground_truth"] for row in answer_rows}
    test_category = category if category.startswith("multi_turn") else f"multi_turn_{category}"
    long_context = "long_context" in test_category or "composite" in test_category
    entries = []
    for row in rows:
        truth = answers[row["id"]]
        entries.append(
            BfclEntry(
                id=row["id"],
                category=category,
                involved_classes=tuple(row["involved_classes"]),
                initial_config=row.get("initial_config", {}),
                ground_truth=tuple(tuple(turn) for turn in truth),
                excluded=tuple(row.get("excluded_function", ())),
                missed={int(k): tuple(v) for k, v in row.get("missed_function", {}).items()},
                long_context=long_context,
            )
        )
    return entries


def build_instances(entry: BfclEntry) -> dict[str, object]:
    """Fresh backend instances for ``entry``'s involved classes, keyed by class name,
    built as BFCL's ``execute_multi_turn_func_call`` does: ``cls()``, then (unless the
    class is in BFCL's ``STATELESS_CLASSES``) ``_load_scenario(deepcopy(config),
    long_context=entry.long_context)`` with ``config = initial_config.get(name, {})``."""
    stateless = set(backend_config().STATELESS_CLASSES)
    instances: dict[str, object] = {}
    for class_name in entry.involved_classes:
        instance = backend_class(class_name)()
        if class_name not in stateless:
            config = entry.initial_config.get(class_name, {})
            instance._load_scenario(copy.deepcopy(config), long_context=entry.long_context)
        instances[class_name] = instance
    return instances


def withheld_for_turn(
    entry: BfclEntry,
    turn: int,
    functions: Mapping[str, BfclFunction],
    *,
    withhold_excluded: bool = True,
) -> set[str]:
    """The tool names a session withholds during ``turn`` (0-based): every function of a
    class not in ``involved_classes``, the ``excluded_function`` names (unless
    ``withhold_excluded`` is false), and each ``missed_function`` name before the turn
    that reveals it."""
    involved = set(entry.involved_classes)
    withheld = {name for name, f in functions.items() if f.class_name not in involved}
    if withhold_excluded:
        withheld.update(entry.excluded)
    for reveal_turn, names in entry.missed.items():
        if turn < reveal_turn:
            withheld.update(names)
    return withheld


def public_state(instance: object) -> dict[str, Any]:
    """An instance's public attributes (``vars``, names not starting with ``_``)."""
    return {k: v for k, v in vars(instance).items() if not k.startswith("_")}


def state_differences(got: object, expected: object) -> list[str]:
    """Names of the public attributes whose values differ (``!=``, deep for containers)
    between two instances of one class, or that only one of them has; sorted."""
    return differing_attributes(public_state(got), public_state(expected))


def differing_attributes(got: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """Names of the keys of two public states (:func:`public_state`) whose values differ
    (``!=``), or that only one of them has; sorted."""
    a, b = got, expected
    return sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or a[k] != b[k])
