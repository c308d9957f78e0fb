"""What a Ray call or Ray actor asks Ray for (DESIGN §5): :class:`RayResources`, checked
at registration. Plain data: no Ray import."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RayResources"]


@dataclass(frozen=True, slots=True)
class RayResources:
    """What one call (or one Ray actor) asks Ray for, per Ray's ``.options()``:
    ``num_cpus`` and ``num_gpus`` (logical units, fractions allowed), ``memory`` (bytes,
    reserved for scheduling, not a limit), ``runtime_env`` (Ray's dict: ``pip``,
    ``env_vars``, ``working_dir``...) and ``resources``, custom resources by name.

    Raises ``ValueError`` naming a negative amount or a bad type.
    """

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: int | None = None
    runtime_env: Mapping[str, Any] | None = None
    resources: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        amounts = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, **dict(self.resources)}
        if self.memory is not None:
            amounts["memory"] = self.memory
        for key, value in amounts.items():
            if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"ray resource {key!r} must be a number >= 0, got {value!r}")
        if self.runtime_env is not None and not isinstance(self.runtime_env, Mapping):
            raise ValueError(f"runtime_env must be a mapping (Ray's runtime_env dict), got {type(self.runtime_env)}")

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any] | RayResources | None) -> RayResources:
        """From ``register(..., resources={...})``: the known keys above, and any other key
        as a custom resource (``{"num_cpus": 2, "browser": 1}``). Raises ``ValueError``."""
        if spec is None:
            return cls()
        if isinstance(spec, RayResources):
            return spec
        known = {k: spec[k] for k in ("num_cpus", "num_gpus", "memory", "runtime_env") if k in spec}
        custom = dict(spec.get("resources", {}))
        custom.update({k: v for k, v in spec.items() if k not in known and k != "resources"})
        return cls(**known, resources=custom)

    def demand(self) -> dict[str, float]:
        """Ray's resource names and amounts (``CPU``, ``GPU``, ``memory``, custom), non-zero."""
        wanted = {"CPU": float(self.num_cpus), "GPU": float(self.num_gpus), **{k: float(v) for k, v in
                                                                                self.resources.items()}}
        if self.memory:
            wanted["memory"] = float(self.memory)
        return {k: v for k, v in wanted.items() if v > 0}

    def options(self) -> dict[str, Any]:
        """Keyword arguments for Ray's ``.options()``."""
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory is not None:
            opts["memory"] = self.memory
        if self.resources:
            opts["resources"] = dict(self.resources)
        if self.runtime_env is not None:
            opts["runtime_env"] = dict(self.runtime_env)
        return opts
