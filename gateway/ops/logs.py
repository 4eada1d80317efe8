"""Structured logs on stdout: one JSON object a line (or plain text), set up once.

Every record carries time, level and logger; the ``extra`` fields a call passes
(request id, route, status, durations, the token fingerprint, ...) become keys of
the JSON object. Nothing in the gateway ever passes a token to a logger.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from aiohttp.http_exceptions import BadHttpMessage

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}

LogFormat = Literal["json", "text"]


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        line.update(_extras(record))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """``time level logger message key=value ...`` for people reading a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        text = f"{when} {record.levelname:<7} {record.name} {record.getMessage()}"
        if extras:
            text += " " + extras
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class MalformedRequestFilter(logging.Filter):
    """aiohttp logs a request its parser rejects (a header too long, control bytes in
    a header) with the exception, whose text quotes the offending line: an
    Authorization header, token and all. Keep the event, drop the quote."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, BadHttpMessage):
            record.msg = "rejected a malformed HTTP request (%s)"
            record.args = (type(error).__name__,)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def configure_logging(level: str, fmt: LogFormat) -> None:
    """Send every log record to stdout in ``fmt`` at ``level`` (replaces earlier setup)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").disabled = True
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedRequestFilter) for f in server_log.filters):
        server_log.addFilter(MalformedRequestFilter())


def set_level(level: str) -> None:
    logging.getLogger().setLevel(level.upper())
