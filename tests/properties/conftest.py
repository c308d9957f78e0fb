"""Hypothesis profiles: ``ci`` (the default, about 30 s for all properties) and ``deep``
(``RHO_FUZZ=deep``: many more examples, no deadline). Examples a run finds are pinned as
ordinary tests in ``tests/test_fuzz_regressions.py``."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=100, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "deep", max_examples=2_000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("deep" if os.environ.get("RHO_FUZZ") == "deep" else "ci")
