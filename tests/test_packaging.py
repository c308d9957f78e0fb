"""The package as a new user installs it: ``python -m build`` makes a wheel and an sdist
(of a copy of the checkout, so the tree is left alone), the wheel installs in a fresh
virtual environment, the quickstart runs from it and prints what the README says, the
console script answers ``--version``, and every extra the README names resolves.

Offline: the build runs without isolation (the dev extra's ``build``, ``setuptools`` and
``wheel``), and the fresh environment sees this one's dependencies through a ``.pth``
line (``pip install --no-deps --no-index`` of the wheel itself). About 20 s of CPU (the
build), hence outside the default run: ``pytest -m slow tests/test_packaging.py``."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import WAIT_S

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
VERSION = re.search(r"^version = (\S+)$", (ROOT / "setup.cfg").read_text(), flags=re.M).group(1)  # type: ignore[union-attr]
EXTRAS = ("mcp", "openai", "anthropic", "otel", "ray", "langgraph", "openai-agents", "pydantic-ai", "fastapi")


def _run(*argv: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=4 * WAIT_S, cwd=cwd,
                          check=False)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build --sdist --wheel`` of a copy of the checkout."""
    pytest.importorskip("build", reason="the dev extra's 'build' is not installed")
    source = tmp_path_factory.mktemp("source")
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "rho_actors", source / "rho_actors", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", out, source)
    return out


def test_build_makes_a_wheel_and_an_sdist_with_the_package_and_its_extras(dist: Path) -> None:
    wheel = dist / f"rho_actors-{VERSION}-py3-none-any.whl"
    sdist = dist / f"rho_actors-{VERSION}.tar.gz"
    assert wheel.is_file() and sdist.is_file(), sorted(p.name for p in dist.iterdir())
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"rho_actors-{VERSION}.dist-info/METADATA").decode()
        entry_points = zf.read(f"rho_actors-{VERSION}.dist-info/entry_points.txt").decode()
    assert {"rho_actors/py.typed", "rho_actors/cli/commands.py", "rho_actors/declarations/metaschema.py"} <= names
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
    assert "rho-actors = rho_actors.cli:main" in entry_points
    assert set(EXTRAS) <= set(re.findall(r"^Provides-Extra: (\S+)$", metadata, flags=re.M))
    assert re.search(r'^Requires-Dist: mcp.*; extra == "mcp"$', metadata, flags=re.M)
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert {"setup.cfg", "pyproject.toml", "README.md", "rho_actors/__init__.py", "rho_actors/py.typed"} <= members


def test_the_wheel_installs_in_a_fresh_venv_and_runs_the_quickstart(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    # this environment's dependencies, not its (editable) rho_actors: a .pth line is a plain path entry
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = dist / f"rho_actors-{VERSION}-py3-none-any.whl"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "--quiet", wheel)
    run_dir = tmp_path / "run"  # away from the checkout, whose folder would come first on sys.path
    run_dir.mkdir()
    where = _run(python, "-c", "import rho_actors; print(rho_actors.__file__)", cwd=run_dir).strip()
    assert Path(where).is_relative_to(site), where  # the wheel's copy, not the checkout
    shutil.copy(ROOT / "examples" / "quickstart.py", run_dir / "quickstart.py")
    readme = (ROOT / "README.md").read_text()
    expected = re.findall(r"```text\n(.*?)```", readme, flags=re.S)[0]
    assert _run(python, "quickstart.py", cwd=run_dir) == expected
    assert _run(venv / "bin" / "rho-actors", "--version", cwd=run_dir).strip() == f"rho-actors {VERSION}"
    # every extra the README names resolves against what is installed (offline: nothing to fetch)
    report = _run(sys.executable, "-m", "pip", "--python", python, "install", "--dry-run", "--no-index",
                  "--find-links", dist, f"rho_actors[{','.join(EXTRAS)}]", cwd=run_dir)
    assert "Would install" not in report, report
