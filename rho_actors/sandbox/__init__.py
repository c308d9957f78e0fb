"""Child processes for untrusted tools (DESIGN §3 and §5): throwaway declaration reads,
the worker processes of ``process`` isolation, and selftests all use this one core.

This package's face is the names below (``__all__``): modules outside ``sandbox/``
import only these, never a submodule (``tests/test_layout.py`` checks it), so the
submodules may change shape freely. The main ones: :class:`WorkerPool` (warm workers; a
call's worker is killed at its deadline) and the :class:`WorkerCall` it runs,
:func:`read_declaration_isolated` and :func:`raw_declaration` (a declaration read in a
throwaway process, answered as JSON data), the confinement policy
(:class:`ConfinePolicy`, :func:`default_policy`, :data:`UNCONFINED`), plugin files
(:func:`discover_plugin`, :class:`PluginRef`), the pieces of a throwaway child that
selftests use, and the call frames a Ray task serves (:func:`call_request`,
:func:`serve_request`). The submodules are internal:

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
tool started, unless it left the group itself) and lives under ``RLIMIT_AS``: the
address space it started with (what the fork server preloaded, rho_actors included,
about 45 MiB) plus ``heap_bytes``.
"""

from rho_actors.sandbox.channel import Channel, DeadlineReached, Malformed
from rho_actors.sandbox.child import ChildSetup
from rho_actors.sandbox.clean import preload_modules, spawn_clean
from rho_actors.sandbox.confine.confinement import Confinement, make_session_dir
from rho_actors.sandbox.confine.enclosure import (
    TREE_ONLY,
    UNCONFINED,
    ConfinePolicy,
    Enclosure,
    default_policy,
    policy_stats,
    system_policy,
)
from rho_actors.sandbox.confine.uids import DEFAULT_UID_RANGE, UidRange, UidRangeExhausted
from rho_actors.sandbox.main_guard import UnguardedStartError, refuse_unguarded_children, refuse_unguarded_start
from rho_actors.sandbox.plugins import (
    DEFAULT_DISCOVERY_TIMEOUT_S,
    NoTools,
    PluginLoadError,
    PluginRef,
    discover_plugin,
    load_module_file,
    tools_in_module,
)
from rho_actors.sandbox.pool import CALL_SCOPE, KILLED_REAP_S, WorkerPool
from rho_actors.sandbox.processes import (
    Child,
    close,
    context,
    hold_servers,
    mib,
    preload_trusted_modules,
    reap,
    release_servers,
    signal_name,
    spawn,
)
from rho_actors.sandbox.reads import (
    DEFAULT_HEAP_BYTES,
    DEFAULT_READ_TIMEOUT_S,
    IsolatedReadError,
    ReadFailure,
    become_subreaper,
    declaration_answer_bytes,
    end_child,
    linger,
    raw_declaration,
    read_declaration_isolated,
)
from rho_actors.sandbox.replies import Waiter
from rho_actors.sandbox.server_process import server_child
from rho_actors.sandbox.shipping import (
    ShippedTools,
    Unshippable,
    local_modules,
    register_by_value,
    ship,
)
from rho_actors.sandbox.slots import WorkerSlots
from rho_actors.sandbox.start_bound import DEFAULT_START_TIMEOUT_MS, START_TIMEOUT_ENV, default_start_timeout_ms
from rho_actors.sandbox.sweep import sweep_leftovers
from rho_actors.sandbox.wire import (
    CODECS,
    MAX_REPLY_BYTES,
    MAX_SELFTEST_BYTES,
    MAX_SERVED_BYTES,
    NEED_TOOL,
    READY,
    RESULT,
    RESULT_RETIRE,
    SELFTEST,
    SERVE,
    SERVED,
    CallRequest,
    WireError,
    WorkerCall,
    call_request,
    decode_call,
    decode_json,
    decode_served,
    encode_call,
    encode_json,
)
from rho_actors.sandbox.worker import TOOL_CACHE_SIZE, WorkerConfig, serve_request

__all__ = [
    "CALL_SCOPE",
    "CODECS",
    "CallRequest",
    "Channel",
    "Child",
    "ChildSetup",
    "ConfinePolicy",
    "Confinement",
    "DEFAULT_DISCOVERY_TIMEOUT_S",
    "DEFAULT_UID_RANGE",
    "DEFAULT_HEAP_BYTES",
    "DEFAULT_READ_TIMEOUT_S",
    "DEFAULT_START_TIMEOUT_MS",
    "DeadlineReached",
    "Enclosure",
    "IsolatedReadError",
    "KILLED_REAP_S",
    "MAX_REPLY_BYTES",
    "MAX_SELFTEST_BYTES",
    "MAX_SERVED_BYTES",
    "Malformed",
    "NEED_TOOL",
    "NoTools",
    "PluginLoadError",
    "PluginRef",
    "READY",
    "RESULT",
    "RESULT_RETIRE",
    "ReadFailure",
    "SELFTEST",
    "SERVE",
    "SERVED",
    "START_TIMEOUT_ENV",
    "ShippedTools",
    "TOOL_CACHE_SIZE",
    "TREE_ONLY",
    "UNCONFINED",
    "UidRange",
    "UidRangeExhausted",
    "UnguardedStartError",
    "Unshippable",
    "Waiter",
    "WireError",
    "WorkerCall",
    "WorkerConfig",
    "WorkerPool",
    "WorkerSlots",
    "become_subreaper",
    "call_request",
    "close",
    "context",
    "declaration_answer_bytes",
    "decode_call",
    "decode_json",
    "decode_served",
    "default_start_timeout_ms",
    "default_policy",
    "discover_plugin",
    "encode_call",
    "encode_json",
    "end_child",
    "hold_servers",
    "linger",
    "load_module_file",
    "local_modules",
    "make_session_dir",
    "mib",
    "policy_stats",
    "preload_modules",
    "preload_trusted_modules",
    "raw_declaration",
    "read_declaration_isolated",
    "reap",
    "refuse_unguarded_children",
    "refuse_unguarded_start",
    "register_by_value",
    "release_servers",
    "serve_request",
    "server_child",
    "ship",
    "signal_name",
    "spawn",
    "spawn_clean",
    "sweep_leftovers",
    "system_policy",
    "tools_in_module",
]
