"""A transcript keeps images by digest in a bounded side store (DESIGN §4 "Budgets"):
the transcript stays small and resumable, an image that does not fit is recorded as
omitted, and a missing or altered stored image is left out when read back."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rho_actors import Image, Reply, ToolCall, ToolResult
from rho_actors.agent.image_store import DEFAULT_MAX_IMAGE_STORE_BYTES
from rho_actors.agent.transcript import TRANSCRIPT_NAME, Transcript, load

MIB = 2**20


def _picture(tag: int, mib: int) -> Image:
    return Image(b"\x89PNG" + bytes([tag]) * (mib * MIB - 4))


def _record(path: Path, images: list[Image], *, max_image_bytes: int = DEFAULT_MAX_IMAGE_STORE_BYTES) -> None:
    calls = tuple(ToolCall(f"c{i}", "pictures", "{}") for i in range(len(images)))
    with Transcript(path, max_image_bytes=max_image_bytes) as t:
        t.user(1, "draw")
        t.reply(1, Reply("", calls))
        for i, image in enumerate(images):
            t.result(1, i, ToolResult(f"c{i}", "pictures", True, "one picture", images=(image, image)))


def test_images_are_kept_by_digest_beside_a_small_transcript(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    images = [_picture(i, 3) for i in range(4)]
    _record(path, images)
    assert path.stat().st_size < 8_000  # 24 MiB of images: 32 MiB of base64 inline, before
    stored = sorted(p.name for p in (tmp_path / "images").iterdir())
    assert stored == sorted(hashlib.sha256(i.data).hexdigest() for i in images)  # each image once
    assert (tmp_path / "images").stat().st_mode & 0o777 == 0o700
    history = load(path)
    assert [m.images for m in history.messages[2:]] == [(i, i) for i in images]


def test_the_store_is_bounded_and_says_what_it_left_out(tmp_path: Path) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    images = [_picture(i, 2) for i in range(3)]
    _record(path, images, max_image_bytes=5 * MIB)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    third = records[-1]["images"][0]
    assert "image store is full (5242880 bytes)" in third["omitted"] and third["bytes"] == 2 * MIB
    assert sum(p.stat().st_size for p in (tmp_path / "images").iterdir()) <= 5 * MIB
    history = load(path)  # resumable: the omitted image is left out, nothing else
    assert [len(m.images) for m in history.messages[2:]] == [2, 2, 0]
    assert history.messages[4].text == "one picture"


def test_a_missing_or_altered_image_is_left_out(tmp_path: Path, logs: list[str]) -> None:
    path = tmp_path / TRANSCRIPT_NAME
    images = [_picture(1, 1), _picture(2, 1)]
    _record(path, images)
    (tmp_path / "images" / hashlib.sha256(images[0].data).hexdigest()).unlink()
    (tmp_path / "images" / hashlib.sha256(images[1].data).hexdigest()).write_bytes(b"\x89PNG altered")
    history = load(path)
    assert [m.images for m in history.messages[2:]] == [(), ()]
    assert any("is missing" in m for m in logs) and any("does not match its digest" in m for m in logs)
