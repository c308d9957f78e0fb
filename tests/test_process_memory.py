"""The one memory setting of trusted ``process`` tools (DESIGN §5): ``ActorSystem(
process_heap_bytes=...)`` bounds each trusted worker's tree; the settings that look like
it but are not (``resources={"memory": ...}``, ``Confinement(address_space=...)``) are
refused with a message naming the right one."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ErrorKind, ToolCall
from rho_actors.sandbox.confine.confinement import Confinement, probe
from tests.conftest import WAIT_S

MIB = 2**20
HOST = probe()
CGROUP = HOST.cgroup is None  # this host gives a memory cgroup: the bound is on resident memory


class Allocate:
    """Allocates (and touches) ``mib`` MiB in its worker."""

    name = staticmethod(lambda: "allocate")
    description = staticmethod(lambda: "Allocate memory.")
    parameter_schema = staticmethod(lambda: {"type": "object", "properties": {"mib": {"type": "integer"}}})
    timeout_ms = staticmethod(lambda: 30_000)

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        block = bytearray(args["mib"] * MIB)
        block[::4096] = b"x" * len(block[::4096])
        return f"allocated {len(block) // MIB}"


class Reserving:
    """Imports a module that maps 2 GiB it never touches, then allocates ``mib`` MiB."""

    name = staticmethod(lambda: "reserving")
    description = staticmethod(lambda: "Reserve address space, use a little.")
    parameter_schema = staticmethod(lambda: {"type": "object", "properties": {"mib": {"type": "integer"}}})
    timeout_ms = staticmethod(lambda: 30_000)

    @staticmethod
    def run(args: dict[str, Any], ctx: Any) -> str:
        from tests import reserving_module

        block = bytearray(args["mib"] * MIB)
        block[::4096] = b"x" * len(block[::4096])
        return f"reserved {(len(reserving_module.RESERVED) + len(reserving_module.UNTOUCHED)) // 2**30} GiB"


def _call(system: ActorSystem, mib: int) -> Any:
    [result] = system.start_loop(f"s{mib}").run_turn([ToolCall(f"c{mib}", "allocate", json.dumps({"mib": mib}))])
    return result


def test_process_heap_bytes_bounds_a_trusted_process_tool(tmp_path: Path) -> None:
    with ActorSystem(tmp_path, process_heap_bytes=96 * MIB, warm_workers=0) as system:
        system.register(Allocate, isolation="process")
        assert _call(system, 16).content == "allocated 16"
        over = _call(system, 160)
        assert over.error_kind is ErrorKind.MEMORY
        bound = "resident-memory bound" if CGROUP else "address-space bound (RLIMIT_AS"
        assert f"{bound}" in over.content and "of 96 MiB" in over.content, over.content
        assert "raise it with ActorSystem(process_heap_bytes=...)" in over.content, over.content
    with ActorSystem(tmp_path / "roomy", process_heap_bytes=512 * MIB, warm_workers=0) as system:
        system.register(Allocate, isolation="process")
        assert _call(system, 160).content == "allocated 160"


@pytest.mark.skipif(not CGROUP, reason=f"no memory cgroup on this host: {HOST.cgroup}")
def test_address_space_a_library_reserves_is_not_charged_where_a_cgroup_bounds_resident_memory(tmp_path: Path) -> None:
    """2 GiB mapped at import and never touched, 16 MiB used: within a 256 MiB bound
    (an address-space bound failed every call with MemoryError)."""
    with ActorSystem(tmp_path, process_heap_bytes=256 * MIB, warm_workers=0) as system:
        system.register(Reserving, isolation="process")
        [result] = system.start_loop("s").run_turn([ToolCall("r", "reserving", json.dumps({"mib": 16}))])
        assert result.ok, result.content
        assert result.content == "reserved 2 GiB"
        assert system.stats()["confinement"]["trusted_process"]["memory_bound"] == "cgroup"


def test_the_wrong_memory_settings_are_refused_naming_the_right_one(system: ActorSystem, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"ActorSystem\(process_heap_bytes=\.\.\.\)"):
        system.register(Allocate, isolation="process", resources={"memory": 64 * MIB})
    with pytest.raises(ValueError, match=r"UntrustedReads\(heap_bytes=\.\.\.\).*process_heap_bytes"):
        ActorSystem(tmp_path / "other", confinement=Confinement(address_space=64 * MIB))
    with pytest.raises(ValueError, match="process_heap_bytes must be an int"):
        ActorSystem(tmp_path / "third", process_heap_bytes=-1)


def test_the_address_space_bound_does_not_charge_what_the_child_started_with(tmp_path: Path) -> None:
    """Without a cgroup the bound is ``RLIMIT_AS``: it counts from the address space a
    child starts with (what the fork server preloaded: here 2 GiB a module maps at
    import), so a tool gets its whole bound, and no more."""
    script = textwrap.dedent("""
        import sys
        from tests import reserving_module  # the fork server's preload: 2 GiB mapped
        from rho_actors.sandbox.child import ChildSetup, enter_child
        enter_child(ChildSetup(heap_bytes=64 * 2**20))
        kept = bytearray(16 * 2**20)  # within the bound
        try:
            bytearray(128 * 2**20)  # past it
        except MemoryError:
            print("bounded", len(kept) // 2**20)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT_S,
                          cwd=Path(__file__).parent.parent, check=False)
    assert done.stderr.split()[-2:] == ["bounded", "16"], done.stderr[-2000:]  # a child's stdout goes to stderr
