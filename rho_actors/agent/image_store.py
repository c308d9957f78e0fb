"""A transcript's images, kept by digest beside it (DESIGN §4 "Budgets"; used by
:mod:`rho_actors.agent.transcript`).

A transcript records an image as its SHA-256 digest, MIME type and size; its bytes are
one file, ``images/<sha256 hex>``, in the transcript's folder (a private folder, made
``0700``, no symlink followed: :mod:`rho_actors.files`). The same image is stored once.
The store holds at most ``max_bytes`` (default :data:`DEFAULT_MAX_IMAGE_STORE_BYTES`);
an image that does not fit is not stored, and its record says so (``"omitted"``). On
reading back, an image whose file is missing, too large or does not match its digest
is left out of the result, with a warning: the transcript itself stays small (no
base64 inline) and loads whatever happened to its images.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path
from typing import Final

from loguru import logger

from rho_actors.files import UnsafePathError, open_regular, private_dir

__all__ = ["DEFAULT_MAX_IMAGE_STORE_BYTES", "IMAGES_DIR", "ImageStore"]

DEFAULT_MAX_IMAGE_STORE_BYTES: Final = 256 * 2**20
"""Default bound of a session transcript's image store, in bytes (256 MiB)."""

IMAGES_DIR: Final = "images"
"""The store's folder, beside the transcript."""
_MAX_IMAGE_BYTES: Final = 32 * 2**20
_DIGEST: Final = re.compile(r"[0-9a-f]{64}")


class ImageStore:
    """The images of the transcript whose folder is ``folder``, within ``max_bytes``.
    Raises ``ValueError`` for a ``max_bytes`` that is not a non-negative ``int``."""

    def __init__(self, folder: str | Path, max_bytes: int = DEFAULT_MAX_IMAGE_STORE_BYTES) -> None:
        if type(max_bytes) is not int or max_bytes < 0:
            raise ValueError(f"max_bytes must be a non-negative int, got {max_bytes!r}")
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self._used: int | None = None

    @property
    def path(self) -> Path:
        """The store's folder (``folder / "images"``)."""
        return self.folder / IMAGES_DIR

    def used(self) -> int:
        """The bytes the store holds now."""
        if self._used is None:
            try:
                with os.scandir(self.path) as entries:
                    self._used = sum(e.stat(follow_symlinks=False).st_size for e in entries if e.is_file(
                        follow_symlinks=False))
            except FileNotFoundError:
                self._used = 0
        return self._used

    def put(self, data: bytes) -> tuple[str, bool]:
        """Store ``data``: returns its SHA-256 hex digest and whether it is in the store
        (already there, or written now, durably); ``False`` when it does not fit. Raises
        ``OSError`` (:class:`~rho_actors.files.UnsafePathError` for a symlink in the way)."""
        digest = hashlib.sha256(data).hexdigest()
        target = self.path / digest
        if os.path.lexists(target):
            return digest, True
        if len(data) > _MAX_IMAGE_BYTES or self.used() + len(data) > self.max_bytes:
            return digest, False
        private_dir(self.folder, IMAGES_DIR)
        partial = self.path / f".{digest}.part"
        fd = open_regular(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(partial, target)
        except BaseException:  # a full disk: what was written of it is not kept
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise
        self._used = self.used() + len(data)
        return digest, True

    def get(self, digest: str) -> bytes | None:
        """The bytes stored under ``digest``, or ``None`` (with a warning) when they are
        missing, not a regular file, too large, or do not match the digest."""
        if type(digest) is not str or not _DIGEST.fullmatch(digest):
            logger.warning("image store {}: {!r} is not a SHA-256 digest; the image is left out", self.path, digest)
            return None
        try:
            fd = open_regular(self.path / digest, os.O_RDONLY)
        except FileNotFoundError:
            logger.warning("image store {}: image {} is missing; it is left out", self.path, digest)
            return None
        except (UnsafePathError, OSError) as exc:
            logger.warning("image store {}: image {} cannot be read ({}); it is left out", self.path, digest, exc)
            return None
        try:
            if os.fstat(fd).st_size > _MAX_IMAGE_BYTES:
                logger.warning("image store {}: image {} is too large; it is left out", self.path, digest)
                return None
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(fd)
        data = b"".join(chunks)
        if hashlib.sha256(data).hexdigest() != digest:
            logger.warning("image store {}: image {} does not match its digest; it is left out", self.path, digest)
            return None
        return data
