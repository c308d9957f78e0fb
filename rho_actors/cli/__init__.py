"""The ``rho-actors`` command line (:mod:`rho_actors.cli.commands`: the parser and every
command group; :mod:`rho_actors.cli.tree`: ``rho-actors tree``). ``python -m
rho_actors.cli`` runs it as the ``rho-actors`` script does."""

from rho_actors.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
