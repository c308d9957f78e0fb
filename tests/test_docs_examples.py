"""Every Python example of README.md and the site runs as pasted: each program (a block
and the fragments marked to continue it, see tests/docs_examples.py) runs in a fresh
process in an empty folder of its own, within a bound, and prints exactly the output
its page shows. Blocks that need the network, an API key or a Ray cluster are marked to
skip, saying why."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import WAIT_S
from tests.docs_examples import ROOT, Example, all_examples, examples

EXAMPLES = all_examples()
RUN_BOUND_S = 3 * WAIT_S  # one program, its Python start-up and its actor system's included; only a hang reaches it


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_the_example_runs_and_prints_what_its_page_shows(example: Example) -> None:
    if example.skip:
        pytest.skip(f"{example.id}: {example.skip}")
    # a folder other users can enter: untrusted tools run as `nobody` and read the files
    # an example writes there (a plugin folder); mkdtemp's own mode is 0700
    folder = Path(tempfile.mkdtemp(prefix="rho-example-"))
    folder.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    try:
        (folder / "example.py").write_text(example.code)
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # rho-actors
        run = subprocess.run([sys.executable, "example.py"], cwd=folder, env=env, capture_output=True, text=True,
                             timeout=RUN_BOUND_S, check=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert run.returncode == 0, f"{example.id} exited {run.returncode}:\n{run.stderr[-4000:]}"
    if example.output is not None:
        assert run.stdout == example.output, f"{example.id} printed:\n{run.stdout}"


def test_most_examples_run_and_every_skip_says_why() -> None:
    runnable = [e.id for e in EXAMPLES if not e.skip]
    skipped = [e.id for e in EXAMPLES if e.skip]
    assert len(runnable) >= 20 and 3 * len(skipped) <= len(runnable), (runnable, skipped)
    assert all(len(e.skip or "needs nothing") >= 12 for e in EXAMPLES)


def test_a_marker_that_cannot_apply_is_refused_naming_its_line(tmp_path: Path) -> None:
    page = tmp_path / "marker-check.md"
    cases = {
        "<!-- example: fragment -->\n```python\nx = 1\n```\n": "a fragment with no Python block before it",
        "```python\nx = 1\n```\n<!-- example: skip -->\n```python\ny = 2\n```\n": "a skip marker must say why",
        "<!-- example: output -->\n```text\n1\n```\n": "an output with no Python block before it",
        "```python\nx = 1\n```\n<!-- example: fragment -->\n```sh\nls\n```\n": "a fragment marker before a sh block",
    }
    for text, message in cases.items():
        page.write_text("# a page\n\n" + text)
        with pytest.raises(ValueError, match=f"marker-check.md:[0-9]+: {message}"):
            examples(page)
    page.write_text("```python\nprint(1)\n```\n\n<!-- example: fragment -->\n\n```python\nprint(2)\n```\n"
                    "<!-- example: output -->\n```text\n1\n2\n```\n")
    [example] = examples(page)
    assert (example.code, example.output, example.parts, example.line) == ("print(1)\n\nprint(2)\n", "1\n2\n", 2, 1)
