"""Hostile round 7: what a session's folder, its disk and its peers can do to what rho
keeps on disk (the transcript, its task records), and to the calls of other sessions.

A disk that fills up (or a file size limit, ``RLIMIT_FSIZE``) cuts a write short: the
kernel writes what fits and fails the rest (``ENOSPC``, ``EFBIG``). A transcript's
record cut short in the middle of the file would make the whole session unreadable
once the next record follows it; a task record cut short would replace a whole one.
Each is run in a child process of its own under a real ``RLIMIT_FSIZE`` (the test's
own process writes its capture files). Every wait is bounded by
:data:`~tests.conftest.WAIT_S`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rho_actors.agent.transcript import load
from rho_actors.tasks import records

from .conftest import WAIT_S

pytestmark = pytest.mark.timeout(180)

_LIMITED = """
import resource, signal, sys
from pathlib import Path
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), the process lives
SOFT, HARD = resource.getrlimit(resource.RLIMIT_FSIZE)

def limited(path, room):
    \"\"\"Files may grow no more than ``room`` bytes past ``path``'s size.\"\"\"
    resource.setrlimit(resource.RLIMIT_FSIZE, (Path(path).stat().st_size + room, HARD))

def unlimited():
    resource.setrlimit(resource.RLIMIT_FSIZE, (SOFT, HARD))

def outcome(job):
    try:
        job()
    except OSError as exc:
        print(f"raised {type(exc).__name__}: {exc}", flush=True)
    else:
        print("written", flush=True)
"""


def _child(script: str, folder: Path) -> list[str]:
    """Run ``script`` (after :data:`_LIMITED`) in a child Python with ``folder`` as ``FOLDER``: its lines."""
    code = _LIMITED + f"FOLDER = Path({str(folder)!r})\n" + textwrap.dedent(script)
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


# --- 1. a record cut short by a full disk ---------------------------------------------------------


@pytest.mark.parametrize("per_record", [False, True], ids=["prompt", "per_record"])
def test_a_record_cut_short_by_a_full_disk_is_cut_away_and_the_session_stays_readable(
    tmp_path: Path, per_record: bool
) -> None:
    """The disk fills in the middle of a record (its first 10 bytes fit): the write
    fails, what it wrote is cut away, and once there is room again the next record is
    whole and the transcript reads back (before: line 2 was the torn head of the
    failed record glued to the next one, and every later load of the session raised
    "line 2 is not a valid record")."""
    lines = _child(f"""
        from rho_actors.agent.transcript import Transcript
        path = FOLDER / "transcript.jsonl"
        t = Transcript(path)
        t.open(per_record={per_record})
        t.user(1, "first")
        limited(path, 10)
        outcome(lambda: t.user(1, "x" * 200))
        unlimited()
        outcome(lambda: t.user(1, "after"))
        t.close()
    """, tmp_path)
    assert lines[0].startswith("raised OSError: [Errno 27]"), lines
    assert lines[1] == "written", lines
    history = load(tmp_path / "transcript.jsonl")
    assert [m.text for m in history.messages] == ["first", "after"]
    assert not history.torn


def test_a_task_record_or_image_cut_short_by_a_full_disk_leaves_nothing_cut_short(tmp_path: Path) -> None:
    """A task's record rewritten (its result) when the disk has room for only part of
    it: the write fails with the disk's error and the record before it stays, whole
    (before: ``os.write``'s short count went unseen, and the cut-short record was synced
    and renamed over the whole one: the task was skipped as "not JSON" from then on)."""
    lines = _child("""
        import time
        from rho_actors.tasks import records
        record = {"task_id": "t_" + "a" * 32, "call_id": "c1", "name": "slow", "session_id": "s1",
                  "status": "working", "started": time.time(), "finished": None, "result": None,
                  "delivered": False}
        records.write(FOLDER, record, new=True)
        done = {**record, "status": "completed", "finished": time.time(),
                "result": {"ok": True, "content": "y" * 100_000, "error_kind": None, "duration_ms": 1.0}}
        limited(FOLDER / "tasks" / ("t_" + "a" * 32 + ".json"), 1000)
        outcome(lambda: records.write(FOLDER, done))
        from rho_actors.agent.image_store import ImageStore
        outcome(lambda: ImageStore(FOLDER).put(b"z" * 100_000))  # the same limit: an image cut short too
        unlimited()
    """, tmp_path)
    assert len(lines) == 2 and all(line.startswith("raised OSError") for line in lines), lines
    assert not list((tmp_path / "images").iterdir())  # no part of the image left taking room
    found = records.read_all(tmp_path)
    assert [(r["task_id"], r["status"]) for r in found] == [("t_" + "a" * 32, "working")]
    assert sorted(p.name for p in (tmp_path / "tasks").iterdir()) == ["t_" + "a" * 32 + ".json"]
    json.loads((tmp_path / "tasks" / ("t_" + "a" * 32 + ".json")).read_text())
