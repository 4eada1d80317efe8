"""Configuration: the one settings object (file, environment, flags) and its live reload.

Holds ``settings`` (every key, validated once), ``live`` (the running settings and
what a reload may change without a restart), ``tomlfile`` (reading the file within its
size bound, and for a reload parsing it off the event loop within a time and memory
bound) and ``tomlparse`` (the child process that parses it, standard library only).
Imports nothing of the gateway but ``gateway.routing`` (the TTL keys are the routes')
and ``gateway.errors``.
"""
