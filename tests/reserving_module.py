"""A module that reserves address space at import, as many libraries do (a Rust
extension's arena, JAX, torch, jemalloc): 1 GiB mapped ``PROT_NONE`` and 1 GiB mapped
read-write but never touched. Resident use stays a few MiB."""

from __future__ import annotations

import mmap

GIB = 2**30
RESERVED = mmap.mmap(-1, GIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=0)  # PROT_NONE
UNTOUCHED = mmap.mmap(-1, GIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0))
