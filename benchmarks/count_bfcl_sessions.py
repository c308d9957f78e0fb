"""BFCL base whole sessions through rho, one pass counted by callgrind (PROFILE §30).

Not a benchmark with targets: run it under ``valgrind --tool=callgrind
--instr-atstart=no``; after two warm-up passes it switches instrumentation on for one
pass (``callgrind_control -i on``) and off after it, so callgrind's total is that pass
alone (every thread), to within ~0.3 % run to run. MODE picks what each session does:
``full`` (every turn, as ``bench_peers.py``'s part 4), ``first`` (its first turn with
calls), ``firsttwo`` (its first two), ``startstop`` (``start_loop`` and ``stop`` only) and
``none`` (only the BFCL instances each session is given: the floor under the others)::

    valgrind --tool=callgrind --instr-atstart=no .venv/bin/python benchmarks/count_bfcl_sessions.py 200 full

Without valgrind it runs the same passes (``callgrind_control`` finds no process to switch).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import bench_peers

from rho_actors import ActorSystem, ToolCall

MODES = {"full": 1_000, "first": 1, "firsttwo": 2, "startstop": 0, "none": -1}


def instrument(on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def main(sessions: int, mode: str) -> None:
    turns_kept = MODES[mode]
    bfcl = bench_peers.bfcl_module()
    functions = bfcl.load_functions()
    entries, plans, withheld = bench_peers.planned_sessions(bfcl, sessions, functions)
    with tempfile.TemporaryDirectory() as data, ActorSystem(data_dir=Path(data)) as system:
        bench_peers.register_bfcl(system, bfcl, functions)

        def once() -> None:
            for entry, turns, names in zip(entries, plans, withheld, strict=True):
                instances = bfcl.build_instances(entry)
                if turns_kept < 0:
                    continue
                loop = system.start_loop(session_id=entry.id, withheld=names[0] or (), deps=instances)
                try:
                    ran = 0
                    for t, turn in enumerate(turns):
                        if ran >= turns_kept:
                            break
                        changed = names[t] if t else None
                        if changed is not None:
                            loop.set_withheld(changed)
                        if turn:
                            loop.run_turn([ToolCall(p.call_id, p.name, p.arguments_json) for p in turn])
                            ran += 1
                finally:
                    loop.stop()

        once()
        once()
        gc.collect()
        instrument(True)
        once()
        instrument(False)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200, sys.argv[2] if len(sys.argv) > 2 else "full")
