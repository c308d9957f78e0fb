"""The ``rho-actors`` command line."""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest

from rho_actors.cli import build_parser, main
from rho_actors.integrations import bfcl

pytestmark = pytest.mark.timeout(120)

SUMMARY_KEYS = {
    "category",
    "sessions",
    "turns",
    "calls",
    "isolation",
    "identical",
    "rejected",
    "rejections",
    "different",
    "differences",
    "sessions_identical_state",
    "state_differences",
    "replay_wall_s",
    "direct_wall_s",
    "total_wall_s",
    "overhead_us",
    "turn_overhead_us",
    "exit_code",
}


def test_parser_has_replay_bfcl() -> None:
    args = build_parser().parse_args(["replay", "bfcl", "--category", "miss_func", "--limit", "2", "--json"])
    assert (args.command, args.target, args.category, args.limit, args.json) == ("replay", "bfcl", "miss_func", 2, True)
    defaults = build_parser().parse_args(["replay", "bfcl"])
    assert (defaults.category, defaults.limit, defaults.json, defaults.isolation) == ("base", None, False, "thread")
    for isolation in ("thread", "process", "ray"):
        assert build_parser().parse_args(["replay", "bfcl", "--isolation", isolation]).isolation == isolation


@pytest.mark.parametrize(
    "argv",
    [[], ["replay"], ["replay", "bfcl", "--category", "simple"], ["replay", "bfcl", "--limit", "-1"],
     ["replay", "bfcl", "--isolation", "gpu"], ["nope"]],
)
def test_usage_errors_return_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_help_returns_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "bfcl", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--category" in out and "long_context" in out


def test_missing_bfcl_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> Any:
        if name == "bfcl_eval":
            raise ModuleNotFoundError("No module named 'bfcl_eval'")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", fake)
    assert main(["replay", "bfcl", "--limit", "1", "--json"]) == 2
    captured = capsys.readouterr()
    assert "pip install --no-deps bfcl-eval==2026.3.23 mpmath" in captured.err
    assert captured.out == ""


def test_replay_bfcl_json(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("bfcl_eval")
    assert main(["replay", "bfcl", "--limit", "2", "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data.keys() >= SUMMARY_KEYS
    assert data["category"] == "base" and data["sessions"] == 2 and data["isolation"] == "thread"
    assert data["identical"] == data["calls"] > 0
    assert data["different"] == 0 and data["exit_code"] == 0
    assert set(data["overhead_us"]) == {"n", "p50", "p99", "mean"}
    assert "replay bfcl" not in captured.err  # no progress bar with --json


def test_replay_bfcl_text(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("bfcl_eval")
    assert main(["replay", "bfcl", "--category", "miss_param", "--limit", "1"]) == 0
    captured = capsys.readouterr()
    assert "sessions" in captured.out and "identical results" in captured.out and "exit code 0" in captured.out
    assert "replay bfcl" in captured.err  # the progress bar goes to stderr


def test_replay_bfcl_returns_1_on_a_difference(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("bfcl_eval")
    real_run = bfcl.BfclTool.run

    def tampered(self: bfcl.BfclTool, args: dict[str, Any], ctx: Any) -> Any:
        out = real_run(self, args, ctx)
        return "tampered" if self.name() == "cd" else out

    monkeypatch.setattr(bfcl.BfclTool, "run", tampered)
    assert main(["replay", "bfcl", "--limit", "1", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["different"] > 0 and data["exit_code"] == 1
    assert {d["got"] for d in data["differences"]} == {"tampered"}


def test_tree_prints_the_supervision_tree(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("bfcl_eval")
    assert main(["replay", "bfcl", "--limit", "1", "--tree"]) == 0
    out = capsys.readouterr().out
    for line in ("root supervisor, permanent", "├── declarations worker, permanent", "├── sessions supervisor",
                 "calls running", "├── workers worker, permanent", "├── servers supervisor",
                 "└── tasks supervisor"):
        assert line in out
    assert main(["replay", "bfcl", "--limit", "1", "--tree", "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)["tree"]
    assert [c["id"] for c in tree["children"]] == [
        "declarations", "registry", "calls", "workers", "sources", "sessions", "servers", "tasks",
    ]
