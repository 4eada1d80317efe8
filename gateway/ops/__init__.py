"""Observability that every layer may use: Prometheus metrics, structured logs, the
readiness report, and the per-request trace the access log is made from.

Imports nothing of the gateway but ``gateway.errors``; never aiohttp's web layer.
"""
