"""The child process that parses a config file for a reload (gateway.config.tomlfile).

Run as ``python -I -S tomlparse.py MAX_MEMORY_BYTES CPU_SECONDS``: it bounds its own
address space and CPU time first, then reads the file's bytes from stdin, parses them
with tomllib and writes one pickled tuple to stdout: ``("ok", data)`` or ``("refused",
kind, message)`` with ``kind`` one of ``toml``, ``utf8``, ``nested``, ``memory``. It
imports only the standard library, so that it starts in a few milliseconds and needs
nothing of the gateway on its path.
"""

from __future__ import annotations

import contextlib
import pickle
import resource
import sys
import tomllib
from typing import Any


def _bound(limit: int, value: int) -> None:
    # a system without the limit parses unbounded in memory, still bounded in time
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(limit, (value, value))


def parse(data: bytes) -> tuple[Any, ...]:
    """The outcome of parsing ``data`` as the parent reads it."""
    try:
        return ("ok", tomllib.loads(data.decode("utf-8")))
    except tomllib.TOMLDecodeError as exc:
        return ("refused", "toml", str(exc))
    except UnicodeDecodeError as exc:
        return ("refused", "utf8", exc.reason)
    except RecursionError:
        return ("refused", "nested", "")
    except MemoryError:
        return ("refused", "memory", "")


def main(argv: list[str]) -> int:
    max_memory, cpu_seconds = int(argv[0]), int(argv[1])
    _bound(resource.RLIMIT_AS, max_memory)
    _bound(resource.RLIMIT_CPU, cpu_seconds)
    outcome = parse(sys.stdin.buffer.read())
    try:
        answer = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except RecursionError:
        # tomllib builds dotted keys without recursion; the answer of one that deep cannot
        # be written (nor walked by the settings' checks)
        answer = pickle.dumps(("refused", "nested", ""))
    except MemoryError:
        answer = pickle.dumps(("refused", "memory", ""))
    sys.stdout.buffer.write(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
