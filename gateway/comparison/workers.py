"""One shadow report for every worker of an instance.

With ``server.workers`` > 1 each worker samples and compares its own requests, and an
admin request reaches one worker of them. So every worker writes what it counted to a
file of its own in the folder the workers share (the metrics' folder,
``PROMETHEUS_MULTIPROC_DIR``) once a second and before it answers a report, and a
report adds up every worker's file. A reset writes a marker with a new epoch: the
worker that took it starts again at once, the others within a second, and a report
counts only the files written since the newest marker.

A file holds the counts and examples of the report, and the few whole answers it keeps
(``Tally.keep_answers``: customers' records, in the metrics folder of the instance; no
header, no token); it is
replaced whole (written aside, then renamed), so a reader never sees half of one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import orjson

from gateway.comparison.tally import Tally
from gateway.ops.files import write_whole

log = logging.getLogger("gateway.shadow")
_PREFIX = "shadow-"
_MARKER = "shadow-reset"


class WorkerReports:
    """This worker's part of the instance's shadow report, and the others' (see the
    module's docstring)."""

    def __init__(self, directory: Path, *, pid: int | None = None) -> None:
        self._directory = directory
        self._own = directory / f"{_PREFIX}{pid or os.getpid()}.json"
        self._marker = directory / _MARKER
        self.epoch = self._marked_epoch()
        # (epoch, tally, changes) of what the file holds
        self._written: tuple[int, int, int] | None = None

    def _marked_epoch(self) -> int:
        try:
            return int(self._marker.read_text())
        except (OSError, ValueError):
            return 0

    def reset_due(self) -> bool:
        """Whether another worker reset the report since this one last looked."""
        marked = self._marked_epoch()
        if marked > self.epoch:
            self.epoch = marked
            return True
        return False

    def announce_reset(self) -> None:
        """Tell every worker that the report starts again now."""
        self.epoch = max(time.time_ns(), self.epoch + 1)
        write_whole(self._marker, str(self.epoch).encode())

    def publish(self, tally: Tally) -> None:
        """Write this worker's counts, when they changed since the last write."""
        written = (self.epoch, tally.serial, tally.changes)
        if written == self._written:
            return
        write_whole(self._own, orjson.dumps({"epoch": self.epoch, "tally": tally.snapshot()}))
        self._written = written

    def gather(self, tally: Tally) -> tuple[Tally, int]:
        """Every worker's counts of the same two upstreams since the newest reset, added
        up (this worker's ``tally`` as it is now, whatever the folder holds); and how
        many workers they came from."""
        try:
            self.publish(tally)
            paths = sorted(self._directory.glob(f"{_PREFIX}*.json"))
        except OSError as exc:
            log.warning(
                "shadow: the workers' counts could not be read; this worker's alone",
                extra={"event": "shadow", "error": str(exc)},
            )
            paths = []
        total = Tally(primary=tally.primary, candidate=tally.candidate)
        total.absorb(tally.snapshot())
        workers = 1
        for path in paths:
            if path == self._own:
                continue
            snapshot = self._read(path)
            if snapshot is None or snapshot.get("epoch") != self.epoch:
                continue
            counted = snapshot.get("tally")
            if not isinstance(counted, dict) or (
                counted.get("primary"),
                counted.get("candidate"),
            ) != (tally.primary, tally.candidate):
                continue  # a worker that has not taken a reload yet
            added = Tally(primary=tally.primary, candidate=tally.candidate)
            try:
                added.absorb(counted)
            except (KeyError, TypeError, ValueError, AttributeError):
                log.warning(
                    "shadow: a worker's counts are not in the expected form; left out",
                    extra={"event": "shadow", "file": path.name},
                )
                continue
            total.absorb(added.snapshot())
            workers += 1
        return total, workers

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None  # a worker's file that went away, or could not be read
        return data if isinstance(data, dict) else None

    def remove(self) -> None:
        """Take this worker's file away (it stops)."""
        with contextlib.suppress(OSError):
            self._own.unlink()
