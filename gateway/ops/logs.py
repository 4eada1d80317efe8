"""Structured logs on stdout: one JSON object a line (or plain text), set up once.

Every record carries time, level and logger; the ``extra`` fields a call passes
(request id, route, status, durations, the token fingerprint, ...) become keys of
the JSON object. Nothing in the gateway ever passes a token to a logger.

What Python itself would print (warnings, an exception nobody caught in a thread or a
finaliser) goes to the logs too (:func:`capture_stray_output`), and the one line that
says why the program stops goes to stderr in the same format (:func:`report_stop`,
:func:`report_failure`): with ``json``, every line the server writes is a JSON object.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from aiohttp.http_exceptions import BadHttpMessage

from gateway.errors import ConfigError, StartError

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


# Every character a terminal or a reader of lines may take as a line break or a
# control: C0, DEL, C1, and the separators str.splitlines() also breaks at.
_ESCAPES = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))},
    ord("\t"): "\\t",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def _escaped(value: object) -> str:
    return str(value).translate(_ESCAPES)


class TextFormatter(logging.Formatter):
    """``time level logger message key=value ... traceback`` for people reading a
    terminal: one record is one line, whatever its values hold (a line break or
    another control character in the message, a field or the exception's traceback
    is written as a backslash escape, ``\\n``, ``\\x1b``), so that no value can
    forge a line of its own."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        extras = " ".join(f"{_escaped(k)}={_escaped(v)}" for k, v in _extras(record).items())
        text = f"{when} {record.levelname:<7} {_escaped(record.name)} "
        text += _escaped(record.getMessage())
        if extras:
            text += " " + extras
        if record.exc_info:
            text += " " + _escaped(self.formatException(record.exc_info))
        return text


class MalformedRequestFilter(logging.Filter):
    """aiohttp logs a request its parser rejects (a header too long, control bytes in
    a header) with the exception, whose text quotes the offending line: an
    Authorization header, token and all. Keep the event, drop the quote. A body its
    parser cannot read (``Content-Encoding: gzip`` on bytes that are not) is the same
    event, logged by aiohttp as an unhandled error once the request is answered: it
    is the caller's fault, and a warning without the traceback too."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = _malformed(record.exc_info[1] if record.exc_info else None)
        if error is not None:
            record.msg = "rejected a malformed HTTP request (%s)"
            record.args = (type(error).__name__,)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _malformed(error: BaseException | None) -> BadHttpMessage | None:
    """The parser's rejection ``error`` is, or was raised from (a few links at most)."""
    for _ in range(4):
        if error is None or isinstance(error, BadHttpMessage):
            return error
        error = error.__cause__
    return None


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


def capture_stray_output() -> None:
    """Log what Python would otherwise print on stderr in its own format: warnings
    (logger ``py.warnings``), and exceptions nobody caught in a thread or raised where
    nobody can catch them (a finaliser), with their tracebacks. For the server's
    process, once its logging is set up; the main thread's own exceptions are its
    caller's to log."""
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception
    sys.unraisablehook = _log_unraisable


_stray = logging.getLogger("gateway.process")


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:  # as Python's own hook: a thread may end so
        return
    name = args.thread.name if args.thread is not None else None
    _stray.error("a thread failed", exc_info=args.exc_value, extra={"thread_name": name})


def _log_unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    _stray.error(
        unraisable.err_msg or "Exception ignored in",
        exc_info=unraisable.exc_value,
        extra={"object": repr(unraisable.object)},
    )


def report_failure(
    fmt: LogFormat | None,
    message: str,
    *,
    prefix: str,
    event: str,
    fields: Mapping[str, object] | None = None,
) -> None:
    """Write the one line that says why the program stops, on stderr: with ``fmt``
    json a JSON object like every log line (level error, logger ``gateway.server``,
    ``event`` and ``fields`` as keys); otherwise ``prefix: message``, to be read, its
    control characters escaped as in a text log line."""
    if fmt == "json":
        record = logging.makeLogRecord(
            {
                "name": "gateway.server",
                "levelno": logging.ERROR,
                "levelname": "ERROR",
                "msg": message,
                "event": event,
                **(fields or {}),
            }
        )
        line = JsonFormatter().format(record)
    else:
        line = f"{prefix}: {_escaped(message)}"
    # one write, so that the lines of processes failing at once do not interleave
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def report_stop(
    fmt: LogFormat | None, exc: ConfigError | StartError, *, command: str, **fields: object
) -> None:
    """Say why ``command`` stops (:func:`report_failure`): a ConfigError as
    ``records-gateway: configuration error: ...`` (event ``config_error``), a
    StartError as ``records-gateway COMMAND: ...`` (event ``start_failed``); what the
    error names (``key``, ``path``, ``address``) and ``fields`` are keys of the JSON
    object."""
    if isinstance(exc, ConfigError):
        message, prefix, event = f"configuration error: {exc}", "records-gateway", "config_error"
    else:
        message, prefix, event = str(exc), f"records-gateway {command}", "start_failed"
    report_failure(fmt, message, prefix=prefix, event=event, fields={**exc.where, **fields})
