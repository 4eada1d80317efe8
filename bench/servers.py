"""The servers of one bench run, each a subprocess on 127.0.0.1, all stopped at the end.

:class:`Stack` owns a temporary folder (configs, logs, nginx's files) and every process
it spawned. Each process gets its own session (process group), so a Ctrl-C in the
terminal reaches the bench alone and the bench stops its servers in order; whatever a
server forked (nginx's worker, the gateway's workers) is found by its process group
and stopped too. Nothing else is ever signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from types import FrameType
from typing import TypeVar

BENCH = Path(__file__).resolve().parent
TOKEN = "demo-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0

T = TypeVar("T")


class BenchError(RuntimeError):
    """Something the bench needs did not work; the message says what and shows logs."""


def free_port() -> int:
    """A port free on 127.0.0.1 right now (for servers that cannot bind port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def gateway_command() -> list[str]:
    """``records-gateway`` from the venv running the bench."""
    script = Path(sys.executable).parent / "records-gateway"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway"]


def _child_env() -> dict[str, str]:
    # GATEWAY_* variables would override the bench's config files.
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("GATEWAY_") and key != "PROMETHEUS_MULTIPROC_DIR"
    }


# Plain HTTP for set-up and checks; the load itself is wrk's job. No proxy, ever.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: Message
    body: bytes


def http_get(url: str, headers: Mapping[str, str] | None = None, timeout: float = 10.0) -> Answer:
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return Answer(response.status, response.headers, response.read())
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.headers, exc.read())


def _answers(url: str) -> bool:
    try:
        http_get(url, timeout=1.0)
    except (OSError, urllib.error.URLError):
        return False
    return True


class Proc:
    """One spawned server; its stdout and stderr go to ``log_path``."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_child_env(),
                cwd=BENCH.parent,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 20) -> str:
        shown = self.output().splitlines()[-lines:]
        return "\n".join(f"    {line}" for line in shown) or "    (no output)"

    def stop(self) -> None:
        """SIGTERM, a grace period, then SIGKILL to whatever of its group is left."""
        if self.popen.poll() is not None:
            return
        members = group_members(self.pid)
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"bench: {self.name} ignored SIGTERM; killing it", file=sys.stderr)
        # The leader is reaped only here, so its pid (the group id) cannot have been reused.
        for pid in members | group_members(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(STOP_TIMEOUT_S)


def group_members(pgid: int) -> set[int]:
    """Live processes whose process group is ``pgid`` (from /proc; Linux)."""
    members: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.add(int(entry.name))
    return members


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_in_stack(command: str, work: Callable[[Stack], T]) -> tuple[T | None, int]:
    """``work`` with a new Stack, stopped at the end whatever happens: (its value, 0), or
    (None, exit status) once the message is printed (130 on Ctrl-C or SIGTERM, 1 when
    the bench cannot run)."""
    # Explicitly: a shell that starts the bench in the background leaves SIGINT ignored.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    stack = Stack()
    try:
        return work(stack), 0
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted; stopping everything it started", file=sys.stderr)
        return None, 130
    except BenchError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return None, 1
    finally:
        # Stopping must not be cut short by a second Ctrl-C or SIGTERM.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.close()


class Stack:
    """Every process of one run and their temporary folder; ``close()`` stops them all."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="records-gateway-bench-"))
        self._procs: list[Proc] = []

    def spawn(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv, self.dir / f"{name}.log")
        self._procs.append(proc)
        return proc

    def stop(self, proc: Proc) -> None:
        proc.stop()
        if proc in self._procs:
            self._procs.remove(proc)

    def close(self) -> None:
        while self._procs:
            self._procs.pop().stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_for(proc: Proc, what: str, check: Callable[[], T | None], timeout: float = 0.0) -> T:
    """Poll ``check`` until it returns a value; fail when ``proc`` dies or time runs out."""
    deadline = time.monotonic() + (timeout or START_TIMEOUT_S)
    while True:
        if not proc.alive():
            raise BenchError(
                f"{proc.name} exited with status {proc.popen.returncode} before {what}; "
                f"its output:\n{proc.tail()}"
            )
        value = check()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise BenchError(
                f"{proc.name}: no {what} after {timeout or START_TIMEOUT_S:.0f} s; "
                f"its output:\n{proc.tail()}"
            )
        time.sleep(0.05)


def _line_match(proc: Proc, pattern: re.Pattern[str]) -> Callable[[], str | None]:
    def check() -> str | None:
        found = pattern.search(proc.output())
        return found.group(1) if found else None

    return check


_LISTENING = re.compile(r"listening on (http://\S+)")


def start_upstream(
    stack: Stack, latency_ms: float, tokens: Sequence[str] = (TOKEN,)
) -> tuple[Proc, str]:
    """The reference upstream (``records-gateway demo-upstream``) on a free port,
    accepting each of ``tokens``."""
    argv = [*gateway_command(), "demo-upstream", "--host", "127.0.0.1", "--port", "0"]
    for token in tokens:
        argv += ["--token", token]
    proc = stack.spawn("upstream", [*argv, "--latency-ms", f"{latency_ms:g}"])
    url = wait_for(proc, "listening line", _line_match(proc, _LISTENING))
    return proc, url.rstrip("/")


def start_script(stack: Stack, name: str, script: str, *args: str) -> tuple[Proc, str]:
    """``python bench/<script> <args> --port 0``; ready once it prints the URL it
    listens on (``listening on http://...``)."""
    proc = stack.spawn(name, [sys.executable, str(BENCH / script), *args, "--port", "0"])
    return proc, wait_for(proc, "listening line", _line_match(proc, _LISTENING))


def start_floor(stack: Stack, size: int) -> tuple[Proc, str]:
    return start_script(stack, "floor", "floor.py", "--size", str(size))


def start_miss_floor(stack: Stack, upstream: str) -> tuple[Proc, str]:
    """bench/miss_floor.py in front of ``upstream``, on a free port."""
    return start_script(stack, "miss-floor", "miss_floor.py", "--upstream", upstream)


def start_redis(stack: Stack) -> tuple[Proc, str]:
    """A throw-away redis-server: no persistence, loopback only, a free port."""
    import redis

    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
            "no", "--dir", str(stack.dir), "--logfile", "", "--daemonize", "no"]  # fmt: skip
    proc = stack.spawn("redis", argv)
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0)

    def ours() -> bool | None:
        try:
            info = client.info("server")
        except redis.RedisError:
            return None
        # the port could have been taken between free_port() and the bind
        return True if info.get("process_id") == proc.pid else None

    try:
        wait_for(proc, "PING answer", ours)
    finally:
        client.close()
    return proc, f"redis://127.0.0.1:{port}/0"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def render_toml(sections: Mapping[str, Mapping[str, object]]) -> str:
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
        lines.append("")
    return "\n".join(lines)


KEY_SECRET = "bench-key-secret-0123456789"
LONG_TTL = 3600
ROUTE_NAMES = ("users", "clients", "expenses", "expense", "accounts", "account")


def gateway_config(
    upstream: str,
    backend: str,
    *,
    redis_url: str = "",
    workers: int = 1,
    namespace: str = "rg",
    **cache: object,
) -> dict[str, dict[str, object]]:
    """A gateway config for the bench: no access log (it would measure the logger), a
    long TTL on every route; ``cache`` adds keys to the cache section."""
    section: dict[str, object] = {"backend": backend}
    if backend == "redis":
        section.update(redis_url=redis_url, key_secret=KEY_SECRET, namespace=namespace)
    section.update(cache)
    return {
        "server": {"workers": workers},
        "upstream": {"base_url": upstream},
        "cache": section,
        "cache.ttl_s": dict.fromkeys(ROUTE_NAMES, LONG_TTL),
        "log": {"access": False},
    }


@dataclass(frozen=True, slots=True)
class Gateway:
    proc: Proc
    url: str
    config_path: Path


def start_gateway(stack: Stack, name: str, config: Mapping[str, Mapping[str, object]]) -> Gateway:
    """``records-gateway serve --config <file>``; ready once every worker logged its start."""
    workers = int(str(config.get("server", {}).get("workers", 1)))
    # One worker binds port 0 and logs the port; workers sharing a port need it up front.
    port = 0 if workers == 1 else free_port()
    sections = {key: dict(values) for key, values in config.items()}
    sections["server"] = {**sections.get("server", {}), "host": "127.0.0.1", "port": port}
    path = stack.dir / f"{name}.toml"
    path.write_text(render_toml(sections))
    proc = stack.spawn(name, [*gateway_command(), "serve", "--config", str(path)])

    def started() -> int | None:
        ports = [
            int(str(event["port"]))
            for event in _json_lines(proc.output())
            if event.get("event") == "start"
        ]
        return ports[0] if len(ports) >= workers else None

    bound = wait_for(proc, f"start line of {workers} worker(s)", started)
    url = f"http://127.0.0.1:{bound}"
    wait_for(proc, "answer on /healthz", lambda: True if _answers(url + "/healthz") else None)
    return Gateway(proc, url, path)


def _json_lines(text: str) -> list[dict[str, object]]:
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return events


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (path for path in ("/usr/sbin/nginx", "/sbin/nginx") if os.access(path, os.X_OK)), None
    )


def _peer_place(stack: Stack, name: str, binary: str | None) -> tuple[str, Path, int]:
    """A peer's binary (BenchError when missing), its own folder and a free port."""
    if binary is None:
        raise BenchError(f"{name} is missing: run `make bench` (installs it as root) or install it")
    folder = stack.dir / name
    folder.mkdir()
    return binary, folder, free_port()


def start_nginx(stack: Stack, upstream_url: str) -> tuple[Proc, str]:
    """nginx with ``proxy_cache`` in front of the upstream, from ``nginx.conf.template``."""
    binary, folder, port = _peer_place(stack, "nginx", nginx_binary())
    user_line = "user root;" if os.geteuid() == 0 else ""  # the worker must reach the folder
    conf = (
        (BENCH / "nginx.conf.template")
        .read_text()
        .replace("@USER_LINE@", user_line)
        .replace("@DIR@", str(folder))
        .replace("@PORT@", str(port))
        .replace("@UPSTREAM@", upstream_url.removeprefix("http://"))
    )
    (folder / "nginx.conf").write_text(conf)
    argv = [binary, "-p", f"{folder}/", "-e", str(folder / "error.log"), "-c",
            str(folder / "nginx.conf")]  # fmt: skip
    proc = stack.spawn("nginx", argv)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(proc, "answer on /__bench_ready", _ready(url))
    except BenchError as exc:
        log = (
            (folder / "error.log").read_text(errors="replace")
            if (folder / "error.log").exists()
            else ""
        )
        raise BenchError(f"{exc}\n  error.log:\n{log}") from None
    return proc, url


def _ready(url: str) -> Callable[[], bool | None]:
    """A check that the peer answers the bench's ``/__bench_ready`` with 204."""

    def ready() -> bool | None:
        try:
            answer = http_get(url + "/__bench_ready", timeout=1.0)
        except (OSError, urllib.error.URLError):
            return None
        return True if answer.status == 204 else None

    return ready


def varnishd_binary() -> str | None:
    return shutil.which("varnishd") or next(
        (path for path in ("/usr/sbin/varnishd", "/sbin/varnishd") if os.access(path, os.X_OK)),
        None,
    )


VARNISH_STORAGE = "malloc,512m"


def start_varnish(stack: Stack, upstream_url: str) -> tuple[Proc, str]:
    """varnishd in the foreground in front of the upstream, from ``varnish.vcl``.

    Its working directory (``-n``) is in the temporary folder, the management CLI is off
    (``-T none``), and it runs as the user that started the bench (``-j none``: no jail,
    so that a root bench's varnishd can reach its folder as root's nginx does)."""
    binary, folder, port = _peer_place(stack, "varnish", varnishd_binary())
    host, _, upstream_port = upstream_url.removeprefix("http://").partition(":")
    vcl = (
        (BENCH / "varnish.vcl")
        .read_text()
        .replace("@UPSTREAM_HOST@", host)
        .replace("@UPSTREAM_PORT@", upstream_port)
    )
    (folder / "bench.vcl").write_text(vcl)
    argv = [binary, "-F", "-n", str(folder / "work"), "-a", f"127.0.0.1:{port}",
            "-f", str(folder / "bench.vcl"), "-s", VARNISH_STORAGE, "-T", "none",
            "-j", "none"]  # fmt: skip
    proc = stack.spawn("varnish", argv)
    url = f"http://127.0.0.1:{port}"
    wait_for(proc, "answer on /__bench_ready", _ready(url))
    return proc, url


def rss_bytes(pid: int) -> int:
    """Resident set size of one process (VmRSS in /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchError(f"no VmRSS for pid {pid}")
