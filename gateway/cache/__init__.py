"""Where answers are kept: the entry and its key, the backend protocol, the memory and
Redis backends, the near cache in front of Redis, and the breaker that keeps a cache
fault from ever failing a request.

Imports ``gateway.errors`` and ``gateway.ops`` only: nothing of records, HTTP or aiohttp.
"""
