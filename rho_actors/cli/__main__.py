"""``python -m rho_actors.cli``: the ``rho-actors`` command line."""

from rho_actors.cli.main import main

raise SystemExit(main())
