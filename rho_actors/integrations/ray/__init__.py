"""Ray: stateful tool servers as Ray actors supervised by rho's OTP layer
(:mod:`.servers`: ``RayActor``, ``RayServer``, ``RayCall``). Tool calls as Ray tasks,
the engine of ``isolation="ray"``, are :mod:`rho_actors.isolation.ray_tasks`. Needs the
``ray`` extra; nothing here imports Ray before it is used."""
