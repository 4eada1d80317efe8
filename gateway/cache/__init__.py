"""Where answers are kept: the entry and its key, the names of every key and channel in
a shared store, the backend protocol and its capabilities, the registry of backends,
the memory and Redis backends, the connections to the three Redis topologies and
their pub/sub, the near cache in front of any backend that publishes invalidations,
the fleet's announcements, and the breaker that keeps a cache fault from ever failing
a request.

Imports ``gateway.errors``, ``gateway.ops`` and ``gateway.config`` (the cache settings)
only: nothing of records, HTTP or aiohttp.
"""
