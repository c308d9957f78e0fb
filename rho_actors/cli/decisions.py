"""``rho-actors approve`` and ``rho-actors reject``: decide a pending call from any process.

Usage::

    rho-actors approve DATA_DIR SESSION CALL_ID [--by NAME]
    rho-actors reject DATA_DIR SESSION CALL_ID --message TEXT [--by NAME]

The decision is written into the session's transcript (``DATA_DIR/sessions/SESSION/
transcript.jsonl``) under its lock; the host running the session acts on it within a
second (an approved call runs there, once), or the next host at its start. Exit codes:
0 recorded, 1 refused (no such pending call, decided already, past its deadline: the
message names the first decision), 2 usage error or a transcript that cannot be used.
"""

from __future__ import annotations

import argparse
import getpass
from typing import Any

__all__ = ["add_parsers", "run"]


def add_parsers(commands: Any) -> None:
    """Add ``approve`` and ``reject`` to the ``rho-actors`` subcommands."""
    for name, helped in (("approve", "approve a pending call: the running host runs it once"),
                         ("reject", "reject a pending call: it never runs; the model gets the message")):
        parser = commands.add_parser(name, help=helped, description=helped)
        parser.add_argument("data_dir", metavar="DATA_DIR", help="the system's data folder")
        parser.add_argument("session", metavar="SESSION", help="the session id")
        parser.add_argument("call_id", metavar="CALL_ID", help="the pending call's id (loop.pending())")
        parser.add_argument("--by", default=None, metavar="NAME",
                            help="who decides, recorded with the decision (default: the user's login name)")
        if name == "reject":
            parser.add_argument("--message", required=True, help="the text the model gets for the call")
        parser.set_defaults(handler=run, decision="approved" if name == "approve" else "rejected")


def run(args: argparse.Namespace) -> int:
    """Record the decision; print what was recorded, or why not (exit codes: see above)."""
    from rho_actors.agent.transcript import TranscriptError
    from rho_actors.loop.decisions import ApprovalError, decide

    by = args.by
    if by is None:
        try:
            by = getpass.getuser()
        except (KeyError, OSError):
            by = None
    try:
        print(decide(args.data_dir, args.session, args.call_id, args.decision,
                     message=getattr(args, "message", None), decided_by=by))
    except ApprovalError as exc:
        print(f"rho-actors: {exc}")
        return 1
    except (TranscriptError, OSError, ValueError) as exc:
        print(f"rho-actors: {exc}")
        return 2
    return 0
