"""Reading the config file: at most MAX_FILE_BYTES, and for a reload parsed off the
event loop, bounded in time and memory.

At start (``serve``, ``check-config``) the file is read and parsed in the process, as
nothing is served yet. A reload (SIGHUP, ``POST /admin/reload``) runs while serving, and
tomllib is pure Python, quadratic on some inputs (one dotted key of many parts) and
cannot be interrupted in a thread: the bytes go to a short-lived child process
(gateway/config/tomlparse.py) that bounds its own address space, and that is killed
when it takes longer than the time bound. Anything over a bound is a ConfigError that
names the bound; the running configuration then stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import os
import pickle
import stat
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config import tomlparse
from gateway.errors import ConfigError

MiB = 1024 * 1024
MAX_FILE_BYTES = 1 * MiB
"""The largest config file read, at start and on a reload."""


@dataclass(frozen=True, slots=True)
class ParseBounds:
    """How long parsing a reload's file may take (seconds), and how much memory its
    process may map (bytes). A file of MAX_FILE_BYTES of ordinary tables parses in
    about a second and under half the memory bound."""

    timeout_s: float = 5.0
    max_memory_bytes: int = 256 * MiB


def read_toml(path: Path) -> dict[str, Any]:
    """The file at ``path`` parsed here, at most MAX_FILE_BYTES of it (for start)."""
    data = read_bounded(path)
    try:
        return tomllib.loads(data.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise _refused(path, "toml", str(exc)) from exc
    except UnicodeDecodeError as exc:
        raise _refused(path, "utf8", exc.reason) from exc
    except RecursionError as exc:
        raise _refused(path, "nested", "") from exc


async def read_toml_bounded(path: Path, bounds: ParseBounds) -> dict[str, Any]:
    """The file at ``path`` parsed off the event loop: read in a thread (at most
    MAX_FILE_BYTES), parsed in a child process within ``bounds``. Raises ConfigError
    naming the file and what is wrong with it, or the bound it went over."""
    data = await asyncio.to_thread(read_bounded, path, regular_only=True)
    cpu_seconds = math.ceil(bounds.timeout_s) + 1
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            tomlparse.__file__,
            str(bounds.max_memory_bytes),
            str(cpu_seconds),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError as exc:
        raise ConfigError(
            f"config file {path}: cannot start its parser: {exc.strerror or exc}",
            path=str(path),
        ) from exc
    try:
        async with asyncio.timeout(bounds.timeout_s):
            answer, _ = await process.communicate(data)
    except TimeoutError:
        raise ConfigError(
            f"config file {path}: parsing it took longer than {bounds.timeout_s:g} s"
            " (the bound on parsing a config file)",
            path=str(path),
        ) from None
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    return _outcome(path, bounds, answer, process.returncode)


def read_bounded(path: Path, *, regular_only: bool = False) -> bytes:
    """At most MAX_FILE_BYTES of the file at ``path``; ConfigError when it holds more
    (it is not read further) or cannot be read. ``regular_only`` refuses anything but a
    regular file (a named pipe would hold the reload until something writes to it)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_NONBLOCK if regular_only else 0)
    try:
        fd = os.open(path, flags)
        with open(fd, "rb") as handle:
            if regular_only and not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise ConfigError(f"config file {path}: not a regular file", path=str(path))
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path}: not found", path=str(path)) from exc
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}", path=str(path)) from exc
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(
            f"config file {path}: larger than {MAX_FILE_BYTES // MiB} MiB"
            f" ({MAX_FILE_BYTES} bytes), the bound on a config file",
            path=str(path),
        )
    return data


class _AnswerReader(pickle.Unpickler):
    """Reads the child's answer: plain data and the datetime types TOML has, no other
    class."""

    _ALLOWED = frozenset({"datetime", "date", "time", "timezone", "timedelta"})

    def find_class(self, module: str, name: str) -> Any:
        if module == "datetime" and name in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not TOML data")


def _outcome(
    path: Path, bounds: ParseBounds, answer: bytes, returncode: int | None
) -> dict[str, Any]:
    try:
        outcome = _AnswerReader(io.BytesIO(answer)).load()
    except Exception:  # no answer, or not one the child writes
        outcome = None
    if not isinstance(outcome, tuple) or not outcome:
        raise ConfigError(
            f"config file {path}: its parser failed (exit status {returncode})", path=str(path)
        )
    if outcome[0] == "ok" and len(outcome) == 2 and isinstance(outcome[1], dict):
        return outcome[1]
    if outcome[0] == "refused" and len(outcome) == 3:
        kind, message = str(outcome[1]), str(outcome[2])
        if kind == "memory":
            raise ConfigError(
                f"config file {path}: parsing it needed more than"
                f" {bounds.max_memory_bytes // MiB} MiB (the bound on parsing a config file)",
                path=str(path),
            )
        raise _refused(path, kind, message)
    raise ConfigError(f"config file {path}: its parser's answer is unreadable", path=str(path))


def _refused(path: Path, kind: str, message: str) -> ConfigError:
    """Why the file's text is refused, alike whether parsed here or in the child."""
    if kind == "toml":
        reason = f"not valid TOML: {message}"
    elif kind == "utf8":
        reason = f"not UTF-8 text ({message})"
    else:
        reason = "nested too deeply"
    return ConfigError(f"config file {path}: {reason}", path=str(path))
