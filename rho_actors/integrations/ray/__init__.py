"""Ray: tool calls as Ray tasks (:mod:`.tasks`, the engine of ``isolation="ray"``) and
stateful tool servers as Ray actors supervised by rho's OTP layer (:mod:`.servers`).
Needs the ``ray`` extra; nothing here imports Ray before it is used."""
