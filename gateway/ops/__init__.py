"""Observability that every layer may use: Prometheus metrics, structured logs, the
readiness report, and the per-request trace the access log is made from.

Imports nothing of the gateway but ``gateway.errors``, and of aiohttp only the
parser's exception (the log filter keeps a rejected request's text out of the logs).
"""
