"""``python -m rho_actors.cli``: the ``rho-actors`` command line."""

from rho_actors.cli.commands import main

raise SystemExit(main())
