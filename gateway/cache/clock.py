"""The clock seam: wall time for cache ages (shared across instances through Redis)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def __call__(self) -> float:
        """Seconds since the epoch."""
        ...


# time.time itself: a Python function around it costs a frame on every cache read
system_clock: Clock = time.time
