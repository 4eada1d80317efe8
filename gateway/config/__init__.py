"""Configuration: the one settings object (file, environment, flags) and its live reload.

Holds ``settings`` (every key, validated once) and ``live`` (the running settings and
what a reload may change without a restart). Imports nothing of the gateway but
``gateway.errors``.
"""
