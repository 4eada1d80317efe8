"""The upstream link: the client that forwards a validated query with the caller's
token, and what recent traffic says about the upstream's health.

Imports ``gateway.config``, ``gateway.errors`` and ``gateway.ops``; aiohttp's client
only (never its web layer). A query is anything of the ``UpstreamQuery`` shape.
"""
