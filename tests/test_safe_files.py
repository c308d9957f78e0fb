"""Safe files: session folders and transcripts are never reached through a symlink, are
regular files or folders, never block, and nothing is written outside data_dir."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from rho_actors import ActorSystem, ToolCall, ToolResult, tool
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, TranscriptError, load, read_records
from rho_actors.files import UnsafePathError, child_path, open_regular, private_dir
from rho_actors.loop import messages
from tests.conftest import WAIT_S

pytestmark = pytest.mark.timeout(30)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_session_folders_are_created_0700(system: ActorSystem) -> None:
    loop = system.start_loop("s1")
    assert stat.S_IMODE(os.lstat(loop.data_dir).st_mode) == 0o700
    assert loop.data_dir == system.data_dir / "sessions" / "s1"


def test_a_looser_session_folder_is_tightened_to_0700(system: ActorSystem) -> None:
    loose = system.data_dir / "sessions" / "loose"
    loose.mkdir(parents=True, exist_ok=True)
    loose.chmod(0o755)
    (system.data_dir / "sessions").chmod(0o777)
    loop = system.start_loop("loose")
    assert loop.data_dir == loose
    assert stat.S_IMODE(os.lstat(loose).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(system.data_dir / "sessions").st_mode) == 0o700


def test_a_symlinked_session_folder_is_refused_and_nothing_is_written_outside(
    system: ActorSystem, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (system.data_dir / "sessions").mkdir(exist_ok=True)
    (system.data_dir / "sessions" / "evil").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError, match="evil is a symlink, not a folder"):
        system.start_loop("evil")
    assert _files(outside) == []
    system.start_loop("good")  # the system keeps serving


def test_a_symlinked_sessions_folder_is_refused(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    data = tmp_path / "data"
    data.mkdir()
    (data / "sessions").symlink_to(outside, target_is_directory=True)
    system = ActorSystem(data_dir=data)
    try:
        with pytest.raises(ValueError, match="sessions is a symlink"):
            system.start_loop("s1")
    finally:
        system.stop()
    assert _files(outside) == []


def test_a_lying_str_subclass_cannot_move_the_session_folder(system: ActorSystem) -> None:
    class Lying(str):
        def __str__(self) -> str:
            return "fine"

        def __contains__(self, item: object) -> bool:
            return False

        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return 0

    with pytest.raises(ValueError, match="not allowed"):
        system.start_loop(Lying("../../escape"))
    loop = system.start_loop(Lying("plain"))
    assert type(loop.session_id) is str and loop.data_dir == system.data_dir / "sessions" / "plain"
    assert not (system.data_dir.parent / "escape").exists()


def test_a_symlinked_transcript_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me\n")
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / TRANSCRIPT_NAME).symlink_to(target)
    with pytest.raises(TranscriptError, match="symlink"):
        Transcript(folder / TRANSCRIPT_NAME).open()
    with pytest.raises(TranscriptError, match="symlink"):
        load(folder / TRANSCRIPT_NAME)
    assert target.read_text() == "keep me\n"


def test_a_transcript_in_a_symlinked_folder_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    with pytest.raises(TranscriptError, match="symlink"):
        Transcript(tmp_path / "link" / TRANSCRIPT_NAME).open()
    assert list(real.iterdir()) == []


def test_a_fifo_in_place_of_the_transcript_fails_at_once(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    os.mkfifo(path)
    outcome: list[BaseException] = []

    def attempt() -> None:
        for opener in (lambda: Transcript(path).open(), lambda: load(path), lambda: read_records(path)):
            try:
                opener()
            except TranscriptError as exc:
                outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(WAIT_S)
    assert not worker.is_alive(), "opening a FIFO blocked"
    assert len(outcome) == 3 and all("is a FIFO, not a regular file" in str(e) for e in outcome)


def test_a_folder_in_place_of_the_transcript_is_refused(tmp_path: Path) -> None:
    (tmp_path / TRANSCRIPT_NAME).mkdir()
    with pytest.raises(TranscriptError, match="is a folder, not a regular file"):
        Transcript(tmp_path / TRANSCRIPT_NAME).open()


def test_a_device_in_place_of_the_transcript_is_refused(tmp_path: Path) -> None:
    os.symlink("/dev/zero", tmp_path / "dev")
    with pytest.raises(UnsafePathError, match="symlink"):
        open_regular(tmp_path / "dev", os.O_RDONLY)
    with pytest.raises(UnsafePathError, match="character device"):
        open_regular(Path("/dev/null"), os.O_RDONLY)


def test_private_dir_refuses_path_tricks(tmp_path: Path) -> None:
    for part in ("..", ".", "", "a/b"):
        with pytest.raises(ValueError):
            private_dir(tmp_path, part)
    assert private_dir(tmp_path, "a", "b") == tmp_path / "a" / "b"
    assert stat.S_IMODE(os.lstat(tmp_path / "a").st_mode) == 0o700


def test_private_dir_opens_an_existing_folder_and_refuses_what_is_no_folder(tmp_path: Path) -> None:
    root = tmp_path / "new" / "root"
    with pytest.raises(FileNotFoundError):
        private_dir(root, "a", create=False)  # nothing is made without create
    assert not root.exists()
    assert private_dir(root, "a", "b") == root / "a" / "b"  # root made with its parents, then each part
    os.chmod(root / "a" / "b", 0o755)
    assert private_dir(root, "a", "b", create=False) == root / "a" / "b"  # it exists: opened, checked, tightened
    assert stat.S_IMODE(os.lstat(root / "a" / "b").st_mode) == 0o700
    (root / "a" / "file").write_text("x")
    with pytest.raises(UnsafePathError, match=r"a/file is not a regular file|a/file is .*not a folder"):
        private_dir(root, "a", "file")
    os.symlink(tmp_path / "missing", root / "a" / "dangling")
    with pytest.raises(UnsafePathError, match="a/dangling is a symlink, not a folder"):
        private_dir(root, "a", "dangling")  # a dangling symlink is not made into a folder through
    assert not (tmp_path / "missing").exists()
    with pytest.raises(ValueError, match="single path component"):
        private_dir(root, "a", "..", "c")  # refused before anything is opened or made
    assert not (root / "a" / "c").exists()


@tool
def note(ctx: Mapping[str, Any]) -> str:
    """Write a note into the session's folder."""
    (Path(ctx["data_dir"]) / "note.txt").write_text("hi")
    return "ok"


def _first_turn_after(system: ActorSystem, session_id: str, change: Callable[[Path], None]) -> tuple[Path, ToolResult]:
    """Start a session whose folder exists, ``change`` the folder, then run its first call."""
    system.register(note)
    folder = system.data_dir / "sessions" / session_id
    private_dir(system.data_dir, "sessions", session_id)
    loop = system.start_loop(session_id)
    change(folder)
    [result] = loop.run_turn([ToolCall("c1", "note", "{}")])
    loop.stop()
    return folder, result


def test_a_session_folder_removed_after_the_start_is_made_again_before_the_first_call(system: ActorSystem) -> None:
    folder, result = _first_turn_after(system, "gone", lambda folder: folder.rmdir())
    assert result.ok, result.content
    assert (folder / "note.txt").read_text() == "hi"
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700


def test_a_session_folder_replaced_by_a_looser_one_after_the_start_is_tightened(system: ActorSystem) -> None:
    def replace(folder: Path) -> None:
        folder.rmdir()
        folder.mkdir(mode=0o755)
        os.chmod(folder, 0o755)

    folder, result = _first_turn_after(system, "loosened", replace)
    assert result.ok, result.content
    assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700


def test_a_session_folder_replaced_by_a_symlink_after_the_start_is_refused_at_the_first_call(
    system: ActorSystem, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside")

    def replace(folder: Path) -> None:
        folder.rmdir()
        folder.symlink_to(outside, target_is_directory=True)

    _, result = _first_turn_after(system, "swapped", replace)
    assert not result.ok and result.content.startswith("the call did not start: the session folder")
    assert "swapped is a symlink, not a folder" in result.content
    assert _files(outside) == []


def test_the_folder_checked_at_the_start_is_not_walked_again_by_the_first_call(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks: list[tuple[Any, ...]] = []

    def walk(*args: Any, **kwargs: Any) -> Path:
        walks.append(args)
        return private_dir(*args, **kwargs)

    monkeypatch.setattr(messages, "private_dir", walk)
    folder, result = _first_turn_after(system, "kept", lambda folder: None)
    assert result.ok and (folder / "note.txt").read_text() == "hi"
    assert walks == []  # one lstat found the folder start_loop checked: same device and inode, 0700
    _, result = _first_turn_after(system, "kept-then-gone", lambda folder: folder.rmdir())
    assert result.ok and len(walks) == 1  # anything else is walked (and made) again


def test_child_path_is_the_joined_path(tmp_path: Path) -> None:
    """child_path (a session's folder from ``sessions``, made without parsing its name) is ``parent / name``."""
    for name in ("s", "a.b@c:d-e_f", "x" * 128, "..a"):
        made, joined = child_path(tmp_path, name), tmp_path / name
        assert made == joined and str(made) == str(joined) and hash(made) == hash(joined)
        assert type(made) is type(joined) and made.parent == tmp_path and made.name == name
