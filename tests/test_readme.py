"""The README stays a true overview: its quickstart is examples/quickstart.py and prints
what it says; its set-up commands are the Makefile's, and CI runs the same test
command; it stays within 15 KB, and every page its map names exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import WAIT_S

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
MAX_README_BYTES = 15 * 1024


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


def test_the_readme_is_an_overview_within_15_kb_whose_map_leads_to_every_guide() -> None:
    assert len(README.encode()) <= MAX_README_BYTES
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README)
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, missing
    guides = ["tools", "agent-loop", "resuming", "web-service", "untrusted", "mcp-gateway", "frameworks", "supervision",
              "observability", "ray"]
    assert {"docs/getting-started.md", "docs/design/index.md", "docs/reference/index.md",
            *(f"docs/guides/{guide}.md" for guide in guides)} <= set(targets)
