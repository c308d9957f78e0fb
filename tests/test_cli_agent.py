"""``rho-actors chat`` and ``selftest`` as users meet them: --system, the exit code after a
model error, and a broken plugin file reported while the others go on."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import rho_actors.cli.commands as cli_module
from rho_actors.agent.model import Message, Reply, ScriptedModel
from tests.conftest import WAIT_S
from tests.wire_server import OPENAI_PATH, Response, WireServer, openai_completion, openai_error

GOOD = '''
from rho_actors import tool

@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b
'''

OTHER = '''
from rho_actors import tool

def check():
    return None

@tool(selftest=check)
def mul(a: int, b: int = 1) -> int:
    """Multiply two integers."""
    return a * b
'''


def plugins(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "good.py").write_text(GOOD, encoding="utf-8")
    (folder / "other.py").write_text(OTHER, encoding="utf-8")
    (folder / "broken.py").write_text("import nowhere_to_be_found\n", encoding="utf-8")
    return folder


def test_chat_system_prompt_and_exit_code_after_a_model_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with WireServer() as server:
        server.script(OPENAI_PATH, Response(200, openai_completion("hello")),
                      Response(401, openai_error(401, "Incorrect API key provided")))
        monkeypatch.setattr("sys.stdin", io.StringIO("hi\nagain\n"))
        argv = ["chat", "--model", "openai:gpt-test", "--base-url", server.openai_url, "--session", "s1",
                "--data-dir", str(tmp_path / "data"), "--system", "Answer in French.", "--tools",
                str(plugins(tmp_path))]
        assert cli_module.main(argv) == 1
        bodies = server.bodies(OPENAI_PATH)
    captured = capsys.readouterr()
    assert "hello" in captured.out
    assert "Incorrect API key provided" in captured.err
    assert "broken.py" in captured.err and "the other files go on" in captured.err
    assert "tools: add, mul" in captured.out
    assert bodies[0]["messages"][0] == {"role": "system", "content": "Answer in French."}
    assert {t["function"]["name"] for t in bodies[0]["tools"]} == {"add", "mul"}


def test_chat_exits_zero_without_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = ScriptedModel([Reply("bonjour")])
    monkeypatch.setattr(cli_module, "_chat_model", lambda spec, base_url: model)
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    argv = ["chat", "--model", "openai:x", "--data-dir", str(tmp_path), "--system", "Be French."]
    assert cli_module.main(argv) == 0
    assert model.requests[0][0][0] == Message.system("Be French.")
    assert cli_module.main([*argv[:-1], "  "]) == 2
    assert "--system is blank" in capsys.readouterr().err


def test_selftest_reports_a_broken_file_and_runs_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_module.main(["selftest", str(plugins(tmp_path)), "--json", "--timeout", f"{WAIT_S:g}"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 1 and report["exit_code"] == 1 and report["broken_files"] == 1
    assert {r["tool"]: r["outcome"] for r in report["results"]} == {"add": "no selftest", "mul": "passed"}
    assert "broken.py" in captured.err and "nowhere_to_be_found" in captured.err
