"""Integrations with other projects, each imported only when used: :mod:`rho_actors.integrations.bfcl`
(a replay of the Berkeley Function Calling Leaderboard's multi-turn conversations)."""
