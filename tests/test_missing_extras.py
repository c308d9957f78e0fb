"""A missing optional extra, whichever it is, gets the same clear error: what needs it,
the module found missing and the ``pip install 'rho_actors[EXTRA]'`` that installs it
(``rho_actors.mcp``, the framework adapters and ``isolation="ray"`` said only ``No module
named ...``). Each case imports with the extra's module made unimportable, in a child
process of its own making (the test process keeps its modules)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from rho_actors.errors import EXTRAS, missing_extra, needs_extra
from tests.conftest import WAIT_S

CASES = [
    ("mcp", "mcp", "rho_actors.mcp", "import rho_actors.mcp"),
    ("langgraph", "langchain_core", "rho_actors.integrations.langgraph", "import rho_actors.integrations.langgraph"),
    ("openai-agents", "agents", "rho_actors.integrations.openai_agents",
     "import rho_actors.integrations.openai_agents"),
    ("pydantic-ai", "pydantic_ai", "rho_actors.integrations.pydantic_ai", "import rho_actors.integrations.pydantic_ai"),
    ("openai", "openai", "the openai provider", "import rho_actors.agent.providers.openai"),
    ("anthropic", "anthropic", "the anthropic provider", "import rho_actors.agent.providers.anthropic"),
    ("ray", "ray", 'isolation="ray"', textwrap.dedent("""
        import tempfile
        from rho_actors import ActorSystem
        from tests.helpers import echo
        with ActorSystem(tempfile.mkdtemp()) as system:
            system.register(echo, isolation="ray")
    """)),
]

CHILD = """
import json, sys
cases = json.loads(sys.argv[1])
said = []
for extra, module, needed_by, code in cases:
    sys.modules[module] = None  # `import module` now fails as when it is not installed
    try:
        exec(code, {})
        said.append(None)
    except ImportError as exc:
        said.append([type(exc).__name__, str(exc), exc.name])
    del sys.modules[module]
print(json.dumps(said))
"""


def test_every_missing_extra_gets_the_same_error_naming_what_to_install() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASES)], capture_output=True, text=True,
                          timeout=4 * WAIT_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    for (extra, module, needed_by, _), got in zip(CASES, said, strict=True):
        assert got is not None, f"{needed_by}: imported without {module}"
        kind, text, name = got
        assert kind == "ImportError" and name == module, (extra, got)
        assert text == (f"{needed_by} needs the optional extra {extra!r}, which is not installed (no module "
                        f"{module!r}): install it with pip install 'rho_actors[{extra}]'"), text
    assert {extra for extra, *_ in CASES} <= set(EXTRAS)


def test_a_broken_import_of_another_module_is_not_taken_for_a_missing_extra() -> None:
    with pytest.raises(ModuleNotFoundError, match="no_such_module") as caught, needs_extra("mcp", "rho_actors.mcp"):
        import no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert caught.type is ModuleNotFoundError  # not made an ImportError about the mcp extra
    err = missing_extra("ray", "a test", ModuleNotFoundError("No module named 'ray'", name="ray"))
    assert str(err) == ("a test needs the optional extra 'ray', which is not installed (no module 'ray'): "
                        "install it with pip install 'rho_actors[ray]'")


def test_every_extra_of_setup_cfg_is_known() -> None:
    import configparser
    from pathlib import Path

    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parent.parent / "setup.cfg")
    declared = {name for name in config["options.extras_require"] if name not in ("dev", "bfcl", "peers", "docs")}
    assert declared == set(EXTRAS)
