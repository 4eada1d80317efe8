"""Running the gateway as processes: one worker's event loop, server and signals
(``worker``), its listening socket and what serves each connection (``listener``),
and the supervisor that forks several workers on one port
(``supervisor``). Imports ``http``, ``fastpath``, ``normalise`` (to name the rules in
use), ``config``, ``ops`` and ``demo``.
"""
