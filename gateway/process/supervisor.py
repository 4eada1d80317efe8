"""The process supervisor: the gateway in this process, or in several workers.

With ``server.workers = 1`` the gateway runs in this process
(``gateway.process.worker``). With N > 1 this process becomes a small supervisor: it
forks N workers that each listen on the same port (SO_REUSEPORT) with their own event
loop (uvloop on Linux), forwards SIGHUP, SIGTERM and SIGINT to them, and exits once
they all have: 0, or 1 when one failed (it then stops the others). The workers write
their metrics to a shared folder so that /metrics of any of them reports the whole
gateway, and reach each other through Unix sockets in a private folder (mode 0700), so
that an admin action any of them takes is in force in all (``gateway.ops.siblings``);
both folders are removed when the supervisor exits.

What stops the gateway before it serves (an address it cannot listen on, a folder it
cannot write) is a StartError for the caller to report; with several workers the
supervisor finds an address it cannot listen on before it forks, so that it is said
once, not by every worker. An unexpected exception is logged with its traceback, in
the log format like every other line, and the exit status is 1.

What a worker does with SIGHUP, SIGTERM and SIGINT is in ``gateway.process.worker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import tempfile
from pathlib import Path

from gateway.config.live import ConfigSource
from gateway.config.settings import Settings
from gateway.errors import ConfigError, StartError
from gateway.ops.logs import capture_stray_output, configure_logging, report_stop
from gateway.process.worker import SERVE_ADDRESS_KEYS, cannot_listen, run, serve

log = logging.getLogger("gateway.server")
# gateway.ops.metrics.MULTIPROC_ENV, named here: importing prometheus-client before
# this is set would make the workers write their values in process memory only
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_FORWARDED = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


def main_serve(settings: Settings, source: ConfigSource, *, demo: bool) -> int:
    """Serve until told to stop; returns the exit status. Raises StartError (or a
    ConfigError) when the gateway cannot start, for the caller to say why."""
    configure_logging(settings.log.level, settings.log.format)
    capture_stray_output()
    # until the event loop handles SIGHUP (a reload), one must not end the process
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if settings.server.workers == 1:
        try:
            run(serve(settings, source, demo=demo))
        except (StartError, ConfigError):
            raise
        except Exception:
            # a bug, not the operator's doing: its traceback, in the logs' format
            log.exception("the gateway failed", extra={"event": "failed"})
            return 1
        return 0
    return _supervise(settings, source, demo=demo)


def _check_address(settings: Settings) -> None:
    """Raise StartError if the workers could not listen on the address: bind it as
    they will (SO_REUSEPORT), without listening, and let it go."""
    host, port = settings.server.host, settings.server.port

    async def bind() -> None:
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(
                asyncio.Protocol, host, port, reuse_port=True, start_serving=False
            )
        except OSError as exc:
            raise cannot_listen(host, port, exc, SERVE_ADDRESS_KEYS) from None
        server.close()
        await server.wait_closed()

    asyncio.run(bind())


_PR_SET_PDEATHSIG = 1  # prctl(2)
# the exit status of a worker that could not start and said why
_SAID_WHY = 3


def _supervise(settings: Settings, source: ConfigSource, *, demo: bool) -> int:
    """Fork the workers, forward signals to them, reap them."""
    _check_address(settings)
    try:
        metrics_dir = tempfile.mkdtemp(prefix="records-gateway-metrics-")
    except OSError as exc:
        # no writable temporary folder (TMPDIR, then /tmp, ...)
        parent = os.path.dirname(exc.filename) if exc.filename else None
        raise StartError(
            f"cannot make the workers' metrics folder in {parent or 'a temporary folder'}:"
            f" {exc.strerror or exc} (TMPDIR)",
            **({"path": parent} if parent else {}),
        ) from None
    os.environ[MULTIPROC_ENV] = metrics_dir
    try:
        # only this user may reach the workers' sockets in it (mkdtemp: mode 0700)
        control = Path(tempfile.mkdtemp(prefix="records-gateway-control-"))
    except OSError as exc:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        raise StartError(
            f"cannot make the workers' control folder: {exc.strerror or exc} (TMPDIR)"
        ) from None
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
                run(
                    serve(
                        settings,
                        source,
                        demo=demo,
                        reuse_port=True,
                        worker=index,
                        control=control,
                    )
                )
            except (StartError, ConfigError) as exc:
                # what stops it before it serves: the address taken since
                # _check_address, say
                report_stop(settings.log.format, exc, command="serve", worker=index)
                code = _SAID_WHY
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
            # no line of its own for a worker that said why it could not start, nor
            # for one this loop stopped (SIGTERM) because another had failed
            said = code == _SAID_WHY or (status == 1 and code == -signal.SIGTERM)
            status = 1
            if not said:
                log.error("worker exited", extra={"worker": index, "pid": pid, "exit": code})
            forward(signal.SIGTERM, None)
    shutil.rmtree(metrics_dir, ignore_errors=True)
    shutil.rmtree(control, ignore_errors=True)
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
