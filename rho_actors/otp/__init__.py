"""The OTP layer: actors with exit reasons and monitors (:mod:`.actor`), names
(:mod:`.names`), supervisors (:mod:`.supervisor`) and timers (:mod:`.timers`).

This package depends on nothing of rho_actors above it (only on ``encoding`` and
``events``); :mod:`.actor` is the only module of rho_actors that touches pykka's private
names. See DESIGN §6.
"""
