"""The vendored upstream suites run only through ``tests/frameworks/run.py`` (their own
rootdir, conftest and plugins), never in the project's suite."""

collect_ignore = ["upstream", "run.py", "swap_langgraph.py", "swap_openai_agents.py", "swap_pydantic_ai.py"]
