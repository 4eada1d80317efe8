"""What stops a command, run as real subprocesses: one line on stderr naming what and
where, the exit status (1: cannot start or cannot do its work; 2: a usage or
configuration error), never a traceback; for ``serve`` in the format of its logs.

Each test runs its cases at once (a process costs about half a second to start).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.process.worker import cannot_listen

from .test_cli import ROOT, clean_env, free_port

LISTEN_KEYS = "(server.host, server.port, --host, --port)"


@dataclass(frozen=True)
class Case:
    """One command that must stop: ``argv`` after ``python``; what its one line says
    (``said``, in the text or in the JSON object's message) and, for a JSON line, its
    ``event`` and ``fields``."""

    argv: tuple[str, ...]
    code: int
    said: str
    event: str | None = None  # None: a plain line, "records-gateway ...: ..."
    fields: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def gateway(*args: str) -> tuple[str, ...]:
    return ("-m", "gateway", *args)


def environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    return {**env, **extra}


async def run(case: Case, preexec: Callable[[], None] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *case.argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environment(case.env),
        cwd=ROOT,
        preexec_fn=preexec,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def check_all(cases: list[Case], preexec: Callable[[], None] | None = None) -> None:
    results = await asyncio.gather(*(run(case, preexec) for case in cases))
    for case, (code, out, err) in zip(cases, results, strict=True):
        context = f"{case.argv[2:] or case.argv}: exit {code}, stdout {out!r}, stderr {err!r}"
        assert "Traceback" not in out + err, context
        # nothing else: no "stopped" of a process that never started, no banner
        assert out == "", context
        (line,) = err.splitlines()
        assert code == case.code, context
        if case.event is None:
            assert line.startswith("records-gateway"), context
            assert case.said in line, context
            assert not line.startswith("{"), context  # text stays for people
        else:
            logged = json.loads(line)
            assert (logged["level"], logged["event"]) == ("error", case.event), context
            assert case.said in logged["message"], context
            assert {key: logged.get(key) for key in case.fields} == case.fields, context


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


async def test_an_address_the_server_cannot_listen_on_is_one_line_and_exit_1(
    taken_port: int,
) -> None:
    """Held for docs/install.md, "When a command cannot run"."""
    port = str(taken_port)
    in_use = f"cannot listen on 127.0.0.1:{port}: Address already in use"
    await check_all(
        [
            # one worker, log.format json by default
            Case(
                gateway("serve", "--port", port),
                1,
                f"{in_use} {LISTEN_KEYS}",
                "start_failed",
                {"address": f"127.0.0.1:{port}"},
            ),
            # two workers: the supervisor says it once, before it forks them
            Case(
                gateway(
                    "serve", "--demo", "--workers", "2", "--log-format", "text", "--port", port
                ),
                1,
                f"records-gateway serve: {in_use} {LISTEN_KEYS}",
            ),
            # an address not on this machine (a documentation one)
            Case(
                gateway("serve", "--host", "203.0.113.1", "--port", port),
                1,
                f"cannot listen on 203.0.113.1:{port}: Cannot assign requested address",
                "start_failed",
                {"address": f"203.0.113.1:{port}"},
                env={"GATEWAY_SERVER__WORKERS": "2", "GATEWAY_LOG__FORMAT": "json"},
            ),
            Case(
                gateway("demo-upstream", "--port", port),
                1,
                f"records-gateway demo-upstream: {in_use} (--host, --port)",
            ),
        ]
    )


# Linux capabilities (capability.h) that let root bind a low port and read any file
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _CAP_NET_BIND_SERVICE = 1, 2, 10
_PR_CAPBSET_DROP = 24  # prctl(2)


def unprivileged() -> Callable[[], None] | None:
    """What makes a child be refused what a user who is not root is refused (a port
    below 1024, a file of mode 000): nothing for such a user; for root, a child that
    drops the capabilities that let root do them anyway before it runs Python."""
    if os.geteuid() != 0:
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here, not in the forked child

    def drop() -> None:
        for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _CAP_NET_BIND_SERVICE):
            if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    return drop


def port_80_is_refused() -> bool:
    """Whether a user who is not root may not bind port 80 here (Linux's default)."""
    first_free = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start")
    return first_free.is_file() and int(first_free.read_text()) > 80


async def test_what_the_system_denies_is_one_line_naming_it(tmp_path: Path) -> None:
    """Held for docs/install.md, "When a command cannot run"."""
    preexec = unprivileged()
    config = tmp_path / "gateway.toml"
    config.write_text("[upstream]\n")
    config.chmod(0)
    cases = [
        Case(
            gateway("serve", "--log-format", "text", "--config", str(config)),
            2,
            f"records-gateway: configuration error: config file {config}: Permission denied",
        ),
    ]
    if port_80_is_refused():
        cases.append(
            Case(
                gateway("serve", "--port", "80"),
                1,
                f"cannot listen on 127.0.0.1:80: Permission denied {LISTEN_KEYS}",
                "start_failed",
                {"address": "127.0.0.1:80"},
                env={"GATEWAY_LOG__FORMAT": "json"},
            )
        )
    try:
        await check_all(cases, preexec)
    except OSError as exc:
        if os.geteuid() != 0:
            raise
        pytest.skip(f"cannot drop root's capabilities here: {exc}")


async def test_a_file_the_configuration_names_that_does_not_load_is_one_line_and_exit_2(
    tmp_path: Path,
) -> None:
    """Held for docs/install.md, "When a command cannot run"."""
    folder = tmp_path / "a-folder"
    folder.mkdir()
    regular = tmp_path / "a-file"
    regular.write_text("")
    missing = tmp_path / "missing.pem"
    tls = tmp_path / "tls.toml"
    tls.write_text(
        f'[upstream]\nbase_url = "https://records.example"\nca_file = "{missing}"\n'
        '[log]\nformat = "text"\n'
    )
    ca_file = f"upstream.ca_file: {missing} is not a readable file"
    await check_all(
        [
            Case(
                gateway("serve", "--config", str(tmp_path / "none.toml")),
                2,
                f"configuration error: config file {tmp_path / 'none.toml'}: not found",
                "config_error",
                {"path": str(tmp_path / "none.toml")},
            ),
            Case(
                gateway("probe", "--token", "t", "--config", str(regular / "gateway.toml")),
                2,
                f"config file {regular / 'gateway.toml'}: Not a directory",
            ),
            # the log format of a configuration that does not load: the file's ...
            Case(
                gateway("serve", "--config", str(tls)),
                2,
                f"records-gateway: configuration error: {ca_file}",
            ),
            # ... under the environment's
            Case(
                gateway("serve", "--config", str(tls)),
                2,
                f"configuration error: {ca_file}",
                "config_error",
                {"key": "upstream.ca_file"},
                env={"GATEWAY_LOG__FORMAT": "json"},
            ),
            Case(
                gateway("demo-upstream", "--tls-cert", str(folder), "--tls-key", str(missing)),
                2,
                f"records-gateway demo-upstream: --tls-cert {folder}: cannot be read"
                " (Is a directory)",
            ),
        ]
    )


async def test_a_metrics_folder_the_gateway_cannot_write_is_one_line_and_exit_1(
    tmp_path: Path,
) -> None:
    """Held for docs/install.md, "When a command cannot run"."""
    regular = tmp_path / "a-file"
    regular.write_text("")
    # with several workers the supervisor makes the folder in the system's temporary
    # folder (TMPDIR); tempfile.tempdir stands for one that is not a folder
    workers = (
        f"import tempfile; tempfile.tempdir = {str(regular)!r}\n"
        "from gateway.cli import main\n"
        f"main(['serve', '--workers', '2', '--port', '{free_port()}'])\n"
    )
    await check_all(
        [
            Case(
                gateway("serve", "--port", str(free_port())),
                1,
                f"cannot write the metrics in {regular / 'm'}: Not a directory"
                " (PROMETHEUS_MULTIPROC_DIR)",
                "start_failed",
                {"path": str(regular / "m")},
                env={"PROMETHEUS_MULTIPROC_DIR": str(regular / "m")},
            ),
            Case(
                ("-c", workers),
                1,
                f"cannot make the workers' metrics folder in {regular}: Not a directory (TMPDIR)",
                "start_failed",
                {"path": str(regular)},
            ),
        ]
    )


async def test_an_upstream_or_gateway_that_cannot_be_reached_is_one_line_and_exit_1() -> None:
    """Held for docs/install.md, "When a command cannot run"."""
    closed = f"http://127.0.0.1:{free_port()}"
    unreachable = (
        f"the upstream at {closed} (upstream.base_url): cannot connect to the upstream"
        " (Connect call failed"
    )
    port = free_port()
    await check_all(
        [
            Case(
                gateway("probe", "--token", "t"),
                1,
                f"records-gateway probe: {unreachable}",
                env={"GATEWAY_UPSTREAM__BASE_URL": closed},
            ),
            Case(
                gateway("compare", "--token", "t", "--candidate", "http://127.0.0.1:9"),
                1,
                f"records-gateway compare: {unreachable}",
                env={"GATEWAY_UPSTREAM__BASE_URL": closed},
            ),
            Case(
                gateway("ttl-advice"),
                1,
                f"records-gateway ttl-advice: cannot ask the gateway at"
                f" http://127.0.0.1:{port}/admin/ttl",
                env={"GATEWAY_SERVER__PORT": str(port), "GATEWAY_ADMIN__TOKEN": "a" * 16},
            ),
        ]
    )


# a bug while starting: after a warning and a failed thread, an exception no operator
# caused (create_app raises), in a real serve process
BUG = """
import threading, warnings
import gateway.http.app

def create_app(*args, **kwargs):
    warnings.warn("a warning while starting", UserWarning)
    thread = threading.Thread(target=lambda: 1 / 0, name="helper")
    thread.start()
    thread.join()
    raise RuntimeError("a bug while starting")

gateway.http.app.create_app = create_app
from gateway.cli import main
main(["serve", "--port", "0", "--log-format", {fmt!r}])
"""


@pytest.mark.parametrize("fmt", ["json", "text"])
async def test_a_bug_keeps_its_traceback_and_with_json_every_line_is_json(fmt: str) -> None:
    """Held for docs/install.md, "When a command cannot run"; docs/operations.md, "Logs"."""
    code, out, err = await run(Case(("-c", BUG.format(fmt=fmt)), 1, ""))

    assert code == 1
    assert err == ""
    if fmt == "text":
        assert "Traceback" in out
        assert "RuntimeError: a bug while starting" in out
        assert "ZeroDivisionError" in out
        assert "a warning while starting" in out
        return
    lines = [json.loads(line) for line in out.splitlines()]  # every line is JSON
    warning, thread, failed = lines
    assert warning["logger"] == "py.warnings"
    assert "UserWarning: a warning while starting" in warning["message"]
    assert (thread["message"], thread["thread_name"]) == ("a thread failed", "helper")
    assert "ZeroDivisionError" in thread["exception"]
    assert (failed["level"], failed["event"]) == ("error", "failed")
    assert failed["exception"].startswith("Traceback (most recent call last):")
    assert failed["exception"].endswith("RuntimeError: a bug while starting")


def test_an_address_error_without_its_errno_is_said_in_the_systems_words() -> None:
    """Python 3.13's asyncio raises "could not bind on any address out of [...]", with no
    errno, for an address not on this machine: the reason is asked of a plain bind."""
    port = free_port()
    error = OSError(f"could not bind on any address out of [('203.0.113.1', {port})]")
    failure = cannot_listen("203.0.113.1", port, error, "--host, --port")
    assert str(failure) == (
        f"cannot listen on 203.0.113.1:{port}: Cannot assign requested address (--host, --port)"
    )
    assert failure.where == {"address": f"203.0.113.1:{port}"}
