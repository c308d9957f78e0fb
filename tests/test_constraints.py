"""constraints.txt (the exact versions every Makefile install takes, ``make constraints``)
agrees with setup.cfg: every requirement the dev install asks for (``.[dev,bfcl]``, the
runtime's and every extra's) is pinned there, each pin inside setup.cfg's range, and the
vendored framework suites' plugins are pinned too. A dependency added to setup.cfg without
a refreshed constraints.txt would install unpinned; a range raised past its pin would make
``make install`` fail to resolve."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: {line!r} is not NAME==VERSION"
            assert canonicalize_name(name) not in pins, f"constraints.txt pins {name!r} twice"
            pins[canonicalize_name(name)] = version
    return pins


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def _requirements() -> dict[str, list[Requirement]]:
    """setup.cfg's requirements by where they are: install_requires and each extra."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    found = {"install_requires": [Requirement(r) for r in _lines(config["options"]["install_requires"])]}
    for extra, text in config["options.extras_require"].items():
        found[extra] = [Requirement(r) for r in _lines(text)]
    return found


def test_every_requirement_of_the_dev_install_is_pinned_within_its_range() -> None:
    pins, requirements = _pins(), _requirements()
    for where in ("install_requires", "dev", "bfcl"):
        for requirement in requirements[where]:
            name = canonicalize_name(requirement.name)
            assert name in pins, f"setup.cfg's {where} asks for {requirement} but constraints.txt does not pin it: " \
                                 "run make constraints"
            assert requirement.specifier.contains(pins[name], prereleases=True), (
                f"constraints.txt pins {name}=={pins[name]}, outside setup.cfg's {where} range {requirement}")


def test_every_extra_installed_by_the_dev_install_is_pinned_within_its_range() -> None:
    pins = _pins()
    for where, requirements in _requirements().items():
        for requirement in requirements:
            name = canonicalize_name(requirement.name)
            if name in pins:  # an extra's package the dev install does not take (py-spy) is not pinned
                assert requirement.specifier.contains(pins[name], prereleases=True), (
                    f"constraints.txt pins {name}=={pins[name]}, outside setup.cfg's {where} range {requirement}")


def test_the_makefiles_other_installs_are_pinned() -> None:
    pins = _pins()
    makefile = (ROOT / "Makefile").read_text()
    bfcl = re.search(r"^BFCL = (\S+)==(\S+)$", makefile, flags=re.M)
    assert bfcl is not None and pins.get(canonicalize_name(bfcl.group(1))) == bfcl.group(2)
    node = re.search(r"^NODE_WHEEL = (.+)$", makefile, flags=re.M)
    assert node is not None
    wheel = Requirement(node.group(1))
    assert wheel.specifier.contains(pins[canonicalize_name(wheel.name)])
    for requirement in map(Requirement, _lines((ROOT / "tests/frameworks/requirements.txt").read_text())):
        name = canonicalize_name(requirement.name)
        assert name in pins and requirement.specifier.contains(pins[name]), f"{requirement} is not pinned"
