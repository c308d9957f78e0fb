"""The README stays true: its quickstart is examples/quickstart.py and prints what it says;
its set-up commands are the Makefile's, and CI runs the same test command."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import WAIT_S

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_the_quickstart_is_the_example_and_prints_what_the_readme_says() -> None:
    code = _blocks("python")[0]
    example = (ROOT / "examples" / "quickstart.py").read_text()
    assert code in example
    expected = _blocks("text")[0]
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], capture_output=True,
                         text=True, timeout=WAIT_S, check=True)
    assert run.stdout == expected


def test_the_set_up_commands_exist_and_ci_runs_the_test_command() -> None:
    setup = _blocks("sh")[0]
    commands = [line.split("#")[0].strip() for line in setup.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, flags=re.M) and re.search(r"^test:", makefile, flags=re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def _section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_agent_loop_snippets_run_with_a_scripted_model(tmp_path: Path) -> None:
    from rho_actors import ActorSystem, Reply, ScriptedModel, tool

    scripted, real, options = re.findall(r"```python\n(.*?)```", _section("The agent loop"), flags=re.S)

    @tool
    def add(a: int, b: int = 0) -> int:
        """Add two integers."""
        return a + b

    with ActorSystem(data_dir=tmp_path) as system:
        system.register(add)
        loop = system.start_loop("readme")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(scripted, "README.md", "exec"), {"loop": loop})
        [promised] = [line.split("  # ", 1)[1] for line in scripted.splitlines() if line.startswith("print(")]
        assert printed.getvalue() == promised + "\n"

        model = ScriptedModel([Reply(text="3"), Reply(text="3"), Reply(text="5")])
        printed = io.StringIO()
        scope: dict[str, Any] = {"loop": loop, "model": model}
        with contextlib.redirect_stdout(printed):
            exec(compile(options, "README.md", "exec"), scope)
        assert printed.getvalue().startswith("Usage(input_tokens=0, output_tokens=0)\n3")
        assert scope["result"].ok and scope["result"].text == "5"
        assert model.requests[0][0][0].text == "Answer in one sentence."  # the instructions went first
        assert model.options[0] == {"temperature": 0, "max_tokens": 256}

    compile(real, "README.md", "exec")  # needs a key to run: only its names are checked
    import rho_actors.agent.providers

    names = set(re.findall(r"\b(\w+Model)\(", real))
    assert names == {"OpenAIModel", "AnthropicModel"} and names <= set(rho_actors.agent.providers.__all__)


def test_the_command_line_summary_is_the_parser() -> None:
    from rho_actors.cli import build_parser

    [block] = re.findall(r"```\n(rho-actors .*?)```", _section("Command line"), flags=re.S)
    documented: dict[str, set[str]] = {}
    command = ""
    for line in block.splitlines():
        if line.startswith("rho-actors "):
            words = line.split()[1:]
            command = " ".join(w for w in words[:2] if w.isalpha() and w.islower())
            documented.setdefault(command, set())
        documented[command].update(re.findall(r"--[a-z][a-z-]*", line))

    def leaves(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subparsers:  # --verbose: the command line's own, documented once, taken after any command too
            return {prefix.strip(): {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
                    - {"--help", "--verbose"}}
        own = {o for a in parser._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
        own -= {"--verbose"} if prefix else set()
        if own:  # options of the command itself (rho-actors --version)
            found[prefix.strip()] = own
        for name, sub in subparsers[0].choices.items():
            found.update(leaves(sub, f"{prefix} {name}"))
        return found

    assert documented == leaves(build_parser())
