"""The process supervisor: the gateway in this process, or in several workers.

With ``server.workers = 1`` the gateway runs in this process
(``gateway.process.worker``). With N > 1 this process becomes a small supervisor: it
forks N workers that each listen on the same port (SO_REUSEPORT) with their own event
loop (uvloop on Linux), forwards SIGHUP, SIGTERM and SIGINT to them, and exits once
they all have: 0, or 1 when one failed (it then stops the others). The workers write
their metrics to a shared folder so that /metrics of any of them reports the whole
gateway.

What a worker does with SIGHUP, SIGTERM and SIGINT is in ``gateway.process.worker``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import tempfile

from gateway.config.live import ConfigSource
from gateway.config.settings import Settings
from gateway.errors import StartError
from gateway.ops.logs import configure_logging
from gateway.process.worker import run, serve

log = logging.getLogger("gateway.server")
# gateway.ops.metrics.MULTIPROC_ENV, named here: importing prometheus-client before
# this is set would make the workers write their values in process memory only
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_FORWARDED = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


def main_serve(settings: Settings, source: ConfigSource, *, demo: bool) -> int:
    """Serve until told to stop; returns the exit status."""
    configure_logging(settings.log.level, settings.log.format)
    # until the event loop handles SIGHUP (a reload), one must not end the process
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if settings.server.workers == 1:
        try:
            run(serve(settings, source, demo=demo))
        except StartError as exc:
            _start_failed(exc)
            return 1
        return 0
    return _supervise(settings, source, demo=demo)


def _start_failed(exc: StartError, worker: int | None = None) -> None:
    """One log line saying why the server could not start (no traceback: the operator
    put it there, not a bug)."""
    log.error(
        f"records-gateway cannot start: {exc}",
        extra={"event": "start_failed", "error": str(exc), "worker": worker},
    )


_PR_SET_PDEATHSIG = 1  # prctl(2)


def _supervise(settings: Settings, source: ConfigSource, *, demo: bool) -> int:
    """Fork the workers, forward signals to them, reap them."""
    metrics_dir = tempfile.mkdtemp(prefix="records-gateway-metrics-")
    os.environ[MULTIPROC_ENV] = metrics_dir
    children: dict[int, int] = {}
    supervisor = os.getpid()
    for index in range(settings.server.workers):
        pid = os.fork()
        if pid == 0:  # the worker
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_DFL)
            _stop_with(supervisor)
            # a reload before the worker's loop listens for it must not end the worker
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            code = 0
            try:
                run(serve(settings, source, demo=demo, reuse_port=True, worker=index))
            except StartError as exc:
                _start_failed(exc, index)
                code = 1
            except BaseException:
                log.exception("worker failed", extra={"worker": index})
                code = 1
            finally:
                logging.shutdown()
                os._exit(code)
        children[pid] = index

    def forward(signum: int, _frame: object) -> None:
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    for signum in _FORWARDED:
        signal.signal(signum, forward)
    log.info(
        "supervising workers",
        extra={"event": "supervise", "workers": sorted(children), "pid": os.getpid()},
    )
    status = 0
    while children:
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries os.wait
            continue
        index = children.pop(pid, -1)
        code = os.waitstatus_to_exitcode(wait_status)
        _mark_dead(pid)
        if code != 0:
            status = 1
            log.error("worker exited", extra={"worker": index, "pid": pid, "exit": code})
            forward(signal.SIGTERM, None)
    shutil.rmtree(metrics_dir, ignore_errors=True)
    return status


def _stop_with(supervisor: int) -> None:
    """Ask Linux for a SIGTERM when the supervisor dies (SIGKILL, a crash), so that a
    worker never outlives it holding the port; then stop now if it already has."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # pragma: no cover - not Linux with glibc
        return
    if os.getppid() != supervisor:
        os.kill(os.getpid(), signal.SIGTERM)


def _mark_dead(pid: int) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
