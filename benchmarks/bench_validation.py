"""Validation of large argument objects: rho's validator against plain jsonschema
(``Draft202012Validator``, the baseline, measured in the same run) on the keywords whose
work grows with the keys: ``unevaluatedProperties`` (jsonschema: a list look-up per key,
quadratic), ``patternProperties`` with ``additionalProperties`` (a search per key and
pattern). In the loop rho's time is bounded (``MAX_VALIDATION_S``); not here, to see the
real cost.

Prints seconds per validation and the ratio rho / jsonschema for each case and size.

    .venv/bin/python benchmarks/bench_validation.py [--keys N ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from jsonschema import Draft202012Validator

from rho_actors.declarations import arguments
from rho_actors.declarations.arguments import make_validator, violations

CASES: dict[str, dict[str, Any]] = {
    "unevaluatedProperties": {"type": "object", "properties": {f"k{i}": {} for i in range(10)},
                              "unevaluatedProperties": {"type": "integer"}},
    "patternProperties": {"type": "object", "patternProperties": {f"^p{i}": {} for i in range(5)},
                          "additionalProperties": {"type": "integer"}},
}


def seconds(run: Any) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[3_000, 30_000])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    arguments.MAX_KEYWORD_CHECKS = 10**9
    report: dict[str, Any] = {}
    for name, schema in CASES.items():
        for n in args.keys:
            instance = {f"key_{i:06}": i for i in range(n)}
            ours, baseline = make_validator(schema), Draft202012Validator(schema)
            rho_s = seconds(lambda: violations(ours, instance))  # noqa: B023
            jsonschema_s = seconds(lambda: list(baseline.iter_errors(instance)))  # noqa: B023
            report[f"{name}/{n}"] = {"rho_s": rho_s, "jsonschema_s": jsonschema_s, "ratio": rho_s / jsonschema_s}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for case, row in report.items():
        print(f"{case:32} rho {row['rho_s']:8.3f} s   jsonschema {row['jsonschema_s']:8.3f} s   "
              f"ratio {row['ratio']:6.2f}")


if __name__ == "__main__":
    main()
