"""Integrations with other projects, each imported only when used: :mod:`rho_actors.integrations.bfcl`
(a replay of the Berkeley Function Calling Leaderboard's multi-turn conversations),
:mod:`~rho_actors.integrations.ray`, and the framework adapters (DESIGN §6c):
:mod:`~rho_actors.integrations.langgraph` (``RhoToolNode``),
:mod:`~rho_actors.integrations.openai_agents` (``function_tools``) and
:mod:`~rho_actors.integrations.pydantic_ai` (``RhoToolset``)."""
