"""Child processes for untrusted tools (DESIGN §3 and §5): throwaway declaration reads,
the worker processes of ``process`` isolation, and selftests all use this one core.

Public here: :class:`WorkerPool` (warm workers; a call's worker is killed at its
deadline), :func:`read_declaration_isolated` and :func:`raw_declaration` (a declaration
read in a throwaway process, answered as JSON data) and :class:`IsolatedReadError`.
The submodules are internal:

- :mod:`~rho_actors.sandbox.processes`: start method, spawning, killing process groups, reaping;
- :mod:`~rho_actors.sandbox.zygote` and :mod:`~rho_actors.sandbox.clean`: the clean fork
  server every untrusted child comes from (it never imported the host's code), and the
  host's side of it; :mod:`~rho_actors.sandbox.output`: children's output, logged;
  :mod:`~rho_actors.sandbox.sweep`: what a host killed from outside left behind;
- :mod:`~rho_actors.sandbox.child`: :func:`~rho_actors.sandbox.child.enter_child`, run first
  in every child, and the one entry point of every child;
- :mod:`~rho_actors.sandbox.channel`: the framed channel, the same framing on both ends;
- :mod:`~rho_actors.sandbox.wire`: every message type's encoding, tags and size limits;
- :mod:`~rho_actors.sandbox.shipping`: tools shipped with cloudpickle (by value when needed);
- :mod:`~rho_actors.sandbox.plugins`: plugin files, found and loaded in children only when
  untrusted (the host holds a ``PluginRef``);
- :mod:`~rho_actors.sandbox.reads`, :mod:`~rho_actors.sandbox.pool` and
  :mod:`~rho_actors.sandbox.worker`: the two services built on them.

Nothing a child sends back is unpickled by the host (plain data, checked; see
:mod:`~rho_actors.sandbox.wire`), except by a trusted worker of ``codec="pickle"``.
Every child leads its own process group (so killing the group also kills whatever the
tool started, unless it left the group itself) and lives under ``RLIMIT_AS`` =
``heap_bytes`` (the whole address space: an idle child with rho_actors loaded uses
about 45 MiB of it).
"""

from rho_actors.sandbox.pool import WorkerPool
from rho_actors.sandbox.reads import (
    DEFAULT_HEAP_BYTES,
    DEFAULT_READ_TIMEOUT_S,
    IsolatedReadError,
    ReadFailure,
    raw_declaration,
    read_declaration_isolated,
)

__all__ = [
    "DEFAULT_HEAP_BYTES",
    "DEFAULT_READ_TIMEOUT_S",
    "IsolatedReadError",
    "ReadFailure",
    "WorkerPool",
    "raw_declaration",
    "read_declaration_isolated",
]
