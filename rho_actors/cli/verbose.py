"""``rho-actors -v`` / ``-vv``: rho's log (loguru) on stderr for the run of a command.

rho_actors is silent until a host enables its log (loguru's advice for libraries); the
command line is the host here, so ``-v`` shows INFO and above and ``-vv`` DEBUG too, given
before the command or after it (``rho-actors mcp serve -v``)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator

__all__ = ["HELP", "add_verbose", "showing_log"]

HELP = "show rho's log on stderr (-v: INFO and above, -vv: DEBUG too)"


def add_verbose(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every subcommand under it ``-v``/``--verbose`` (a count; a
    subcommand's own overrides one given before the command)."""
    parser.add_argument("-v", "--verbose", action="count", default=0, help=HELP)
    _add_to_subcommands(parser)


def _add_to_subcommands(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=HELP)
                _add_to_subcommands(sub)


@contextlib.contextmanager
def showing_log(verbose: int) -> Iterator[None]:
    """For ``verbose`` > 0: rho's log on stderr (INFO and above, DEBUG too from 2), in
    place of loguru's default sink, until the block ends; nothing for 0."""
    if verbose <= 0:
        yield
        return
    from loguru import logger

    with contextlib.suppress(ValueError):  # loguru's default sink (stderr, every level): ours replaces it
        logger.remove(0)
    sink = logger.add(sys.stderr, level="DEBUG" if verbose > 1 else "INFO", filter="rho_actors")
    logger.enable("rho_actors")
    try:
        yield
    finally:
        logger.disable("rho_actors")
        logger.remove(sink)
