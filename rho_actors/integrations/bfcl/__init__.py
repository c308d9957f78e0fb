"""Replay of the Berkeley Function Calling Leaderboard's multi-turn conversations.

The recorded ground-truth calls of BFCL's multi-turn categories (``base``, ``miss_func``,
``miss_param``, ``long_context``) are sent through the runtime (an :class:`ActorSystem`,
one loop per conversation) against BFCL's own backend classes as tools, and every result
and every final state is compared with a direct execution of the same calls on separate,
fresh instances, done the way BFCL's checker does it.

Nothing of BFCL is copied here: data, declarations and backends come from the installed
``bfcl_eval`` package (``pip install --no-deps bfcl-eval==2026.3.23 mpmath``), imported
only when a replay runs.

Library use::

    from rho_actors.integrations.bfcl import replay
    report = replay(category="base", limit=10)
    print(report.to_json())
    raise SystemExit(report.exit_code)

How BFCL's entry fields are treated (as ``bfcl_eval`` itself does, see
``model_handler/base_handler.py`` and ``utils.populate_test_cases_with_predefined_functions``):

- ``involved_classes``: only these classes get instances (built from ``initial_config``
  with ``_load_scenario(deepcopy(config), long_context=...)``; stateless classes skip it);
  the tools of every other multi-turn class are withheld for the whole session.
- ``missed_function`` (``miss_func`` only): ``{"<turn index>": [names]}``; each name is
  withheld before that turn and offered from that turn on (BFCL adds its doc then).
- ``excluded_function``: withheld for the whole session. (``bfcl_eval`` 2026.3.23 reads
  this field nowhere in its code, so its own inference still offers these functions; no
  ground-truth call uses one, so the choice changes no result. ``withhold_excluded=False``
  mirrors BFCL exactly.)
- ``long_context`` is true for the ``long_context`` category only (BFCL: ``"long_context"
  in category or "composite" in category``).
"""


from rho_actors.integrations.bfcl.convert import (
    BfclFunction,
    BfclTool,
    ParsedCall,
    bind_arguments,
    convert_schema,
    execute_direct,
    format_result,
    load_functions,
    make_tools,
    parse_call,
)
from rho_actors.integrations.bfcl.data import (
    BFCL_VERSION,
    CATEGORIES,
    ERROR_PREFIX,
    INSTALL_HINT,
    MULTI_TURN_CLASSES,
    BfclEntry,
    BfclUnavailableError,
    CallParseError,
    backend_class,
    build_instances,
    load_entries,
    public_state,
    state_differences,
    withheld_for_turn,
)
from rho_actors.integrations.bfcl.replay import replay
from rho_actors.integrations.bfcl.report import Difference, Rejection, ReplayReport, StateDifference

__all__ = [
    "BFCL_VERSION",
    "CATEGORIES",
    "ERROR_PREFIX",
    "INSTALL_HINT",
    "MULTI_TURN_CLASSES",
    "BfclEntry",
    "BfclFunction",
    "BfclTool",
    "BfclUnavailableError",
    "CallParseError",
    "Difference",
    "ParsedCall",
    "Rejection",
    "ReplayReport",
    "StateDifference",
    "backend_class",
    "bind_arguments",
    "build_instances",
    "convert_schema",
    "execute_direct",
    "format_result",
    "load_entries",
    "load_functions",
    "make_tools",
    "parse_call",
    "public_state",
    "replay",
    "state_differences",
    "withheld_for_turn",
]
