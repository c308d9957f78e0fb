"""BFCL base whole sessions through rho alone, for CPU and instruction counts.

A measuring aid (``PROFILE.md`` §12), not a benchmark with targets: the rho path of
``bench_peers.py``'s part 4 (the same planned calls and withheld names, worked out
outside the timings), one warm-up run, then ``RUNS`` timed runs, each printed as the
process CPU and wall seconds it took. For instructions per run, take callgrind's count
of a 3-run process minus a 1-run one and halve it::

    .venv/bin/python benchmarks/replay_bfcl_sessions.py 200 3     # sessions, timed runs
    /work/wt/instr.sh .venv/bin/python benchmarks/replay_bfcl_sessions.py 200 3
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import bench_peers

from rho_actors import ActorSystem, ToolCall


def main(sessions: int, runs: int) -> None:
    bfcl = bench_peers.bfcl_module()
    functions = bfcl.load_functions()
    entries, plans, withheld = bench_peers.planned_sessions(bfcl, sessions, functions)
    with tempfile.TemporaryDirectory() as data, ActorSystem(data_dir=Path(data)) as system:
        bench_peers.register_bfcl(system, bfcl, functions)

        def once() -> None:
            for entry, turns, names in zip(entries, plans, withheld, strict=True):
                loop = system.start_loop(session_id=entry.id, withheld=names[0] or (),
                                         deps=bfcl.build_instances(entry))
                try:
                    for t, turn in enumerate(turns):
                        changed = names[t] if t else None
                        if changed is not None:
                            loop.set_withheld(changed)
                        if turn:
                            loop.run_turn([ToolCall(p.call_id, p.name, p.arguments_json) for p in turn])
                finally:
                    loop.stop()

        once()
        for _ in range(runs):
            gc.collect()
            cpu, wall = time.process_time(), time.perf_counter()
            once()
            print(f"cpu {time.process_time() - cpu:.4f} s  wall {time.perf_counter() - wall:.4f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200, int(sys.argv[2]) if len(sys.argv) > 2 else 3)
