"""The clock seam: wall time for cache ages (shared across instances through Redis)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def __call__(self) -> float:
        """Seconds since the epoch."""
        ...


def system_clock() -> float:
    return time.time()
