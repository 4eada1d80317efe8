"""Answering fresh hits from a connection's bytes, before aiohttp parses them, and
answering as problems what aiohttp answers by itself (a request its parser rejects, one
with no path): the only code of the gateway that touches aiohttp's internals.

``server.make_runner`` checks at start that every internal it relies on is there, with
the shape it expects (``internals``); if one is not, it logs one warning naming it
and the gateway runs as plain aiohttp. Imports from the rest of the gateway only the
records' lookup port (``gateway.records.lookup``) and the edge (``gateway.http.edge``:
its bookkeeping, and what the application gives the fast path through it).
"""
