"""Real multi-process Redis topologies, started by the test suite on free loopback ports.

:class:`RedisCluster` is three cluster primaries (no replicas) joined by
``redis-cli --cluster create``; :class:`SentinelSet` is one primary, one replica and three
Sentinels monitoring them. Both run one ``redis-server`` process per node, each with its
own config file, log file and working directory under one temp dir, no persistence, bound
to 127.0.0.1. ``start()`` returns once the topology is usable (bounded waits, polling) and
raises a :class:`TopologyError` with the nodes' log tails otherwise; ``close()`` always
ends every process and removes the temp dir. Both are context managers.

The harness speaks RESP to the nodes itself (:func:`command`): its control traffic does not
go through redis-py, the client under test.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Self, TypeAlias

from .redis_server import free_port

HOST = "127.0.0.1"
START_TIMEOUT_S = 20.0

Reply: TypeAlias = "str | int | list[Reply] | None"
Address: TypeAlias = tuple[str, int]


class TopologyError(RuntimeError):
    """A topology did not come up (or did not fail over) in time."""


class RespError(Exception):
    """An error reply (``-ERR ...``) from a node."""


# -- a minimal RESP2 client, one connection per command --------------------------------------


def command(
    address: Address, *args: str | int, password: str | None = None, timeout_s: float = 2.0
) -> Reply:
    """Send one command (after AUTH when ``password`` is given) and return its reply.
    An error reply raises :class:`RespError`; a dead or frozen node raises :class:`OSError`
    (a frozen one after ``timeout_s``)."""
    with socket.create_connection(address, timeout=timeout_s) as sock:
        reader = sock.makefile("rb")
        try:
            if password is not None:
                sock.sendall(_encode(("AUTH", password)))
                _read(reader)
            sock.sendall(_encode(args))
            return _read(reader)
        finally:
            reader.close()


def _encode(args: tuple[str | int, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _read(reader: BinaryIO) -> Reply:
    line = reader.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("the node closed the connection")
    kind, body = line[:1], line[1:-2].decode(errors="replace")
    if kind == b"+":
        return body
    if kind == b"-":
        raise RespError(body)
    if kind == b":":
        return int(body)
    if kind == b"$":
        size = int(body)
        return None if size < 0 else reader.read(size + 2)[:-2].decode(errors="replace")
    if kind == b"*":
        count = int(body)
        return None if count < 0 else [_read(reader) for _ in range(count)]
    raise ConnectionError(f"not a RESP2 reply: {line!r}")


def _text(reply: Reply) -> str:
    if not isinstance(reply, str):
        raise TypeError(f"expected a string reply, got {reply!r}")
    return reply


def _fields(reply: Reply) -> dict[str, str]:
    """A flat [name, value, name, value, ...] reply (SENTINEL MASTER and the like)."""
    if not isinstance(reply, list):
        raise TypeError(f"expected an array reply, got {reply!r}")
    items = [str(item) for item in reply]
    return dict(zip(items[::2], items[1::2], strict=True))


def _records(reply: Reply) -> list[dict[str, str]]:
    if not isinstance(reply, list):
        raise TypeError(f"expected an array reply, got {reply!r}")
    return [_fields(item) for item in reply]


def _info(reply: Reply) -> dict[str, str]:
    """The ``name:value`` lines of INFO or CLUSTER INFO."""
    fields: dict[str, str] = {}
    for line in _text(reply).splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields[name] = value
    return fields


def _address(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _quote(value: str) -> str:
    """A value for a redis.conf line (double-quoted, escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _wait(what: str, ready: Callable[[], bool], timeout_s: float, logs: Callable[[], str]) -> None:
    """Poll ``ready`` until it says yes; RespError and OSError count as not yet."""
    deadline = time.monotonic() + timeout_s
    last = "never checked"
    while True:
        try:
            if ready():
                return
            last = "not yet"
        except (OSError, RespError, TypeError, ValueError) as error:
            last = f"{type(error).__name__}: {error}"
        if time.monotonic() >= deadline:
            raise TopologyError(f"{what}: not within {timeout_s:g} s (last: {last}){logs()}")
        time.sleep(0.05)


def _redis_server_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed: run `make test`, which installs it")
    return binary


# -- one process ------------------------------------------------------------------------------


class RedisProcess:
    """One ``redis-server`` (or ``redis-server --sentinel``) process on a loopback port.

    Its config file is written on the first start, from ``config(self)`` (the process's
    ``port`` and ``bus_port`` are chosen by then); later starts reuse the file as it is on
    disk, so a node restarts the way Redis or Sentinel last rewrote it (CONFIG REWRITE).
    """

    def __init__(
        self,
        name: str,
        directory: Path,
        config: Callable[[RedisProcess], list[str]],
        *,
        sentinel: bool = False,
        password: str | None = None,
        after_start: Callable[[RedisProcess], None] | None = None,
    ) -> None:
        self.name = name
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_file = directory / ("sentinel.conf" if sentinel else "redis.conf")
        self.log_file = directory / "redis.log"
        self.sentinel = sentinel
        self.password = password
        self.port = 0
        self.bus_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.frozen = False
        self._config = config
        self._after_start = after_start
        self._binary = _redis_server_binary()

    @property
    def address(self) -> Address:
        return HOST, self.port

    @property
    def node(self) -> str:
        """``127.0.0.1:port``"""
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        """A redis:// URL of this node, with the password when it has one."""
        auth = f":{self.password}@" if self.password is not None else ""
        return f"redis://{auth}{HOST}:{self.port}/0"

    @property
    def running(self) -> bool:
        """The process exists (it may be frozen)."""
        return self.process is not None and self.process.poll() is None

    @property
    def live(self) -> bool:
        """Running and not frozen: it answers."""
        return self.running and not self.frozen

    def command(self, *args: str | int, timeout_s: float = 2.0) -> Reply:
        """One command to this node, authenticated when it has a password."""
        return command(self.address, *args, password=self.password, timeout_s=timeout_s)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the process and wait until it answers PING (then run ``after_start``).
        On its first start, a port taken by someone else between choosing it and binding
        it is chosen again."""
        if self.running:
            return
        first = not self.config_file.exists()
        for attempt in range(5):
            if first:
                self.port = free_port()
                self.bus_port = free_port()
                while self.bus_port == self.port:
                    self.bus_port = free_port()
                lines = [
                    f"port {self.port}",
                    f"bind {HOST}",
                    f"dir {_quote(str(self.dir))}",
                    f"logfile {_quote(str(self.log_file))}",
                    *self._config(self),
                ]
                self.config_file.write_text("\n".join(lines) + "\n")
                self.log_file.unlink(missing_ok=True)
            args = [self._binary, str(self.config_file)]
            if self.sentinel:
                args.append("--sentinel")
            self.process = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            self.frozen = False
            if self._wait_until_up(timeout_s):
                if self._after_start is not None:
                    self._after_start(self)
                return
            taken = "Address already in use" in self.log_tail()
            self.stop()
            if not (first and taken and attempt < 4):
                raise TopologyError(f"{self.name} did not start{self.logs()}")
        raise AssertionError("unreachable")

    def _wait_until_up(self, timeout_s: float) -> bool:
        """Until this process answers on its port (INFO's process_id is its pid: not
        another server that took the port first); False once the process has exited."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            try:
                info = _info(self.command("INFO", "server", timeout_s=0.5))
                if info.get("process_id") == str(self.process.pid):
                    return True
            except (OSError, RespError):
                pass
            time.sleep(0.02)
        return False

    def stop(self) -> None:
        """SIGTERM (after SIGCONT when frozen), SIGKILL if it has not exited within 5 s."""
        if self.process is not None:
            if self.process.poll() is None:
                self.thaw()
                self.process.terminate()
                try:
                    self.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            self.process = None
        self.frozen = False

    def kill(self) -> None:
        """SIGKILL: the node dies at once, as in a crash."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            self.process = None
        self.frozen = False

    def freeze(self) -> None:
        """SIGSTOP: the socket still accepts, nothing answers."""
        assert self.process is not None, f"{self.name} is not running"
        os.kill(self.process.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        """SIGCONT (harmless when not frozen)."""
        if self.running:
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGCONT)
        self.frozen = False

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def logs(self) -> str:
        """The log tail, formatted for an error message."""
        return f"\n--- {self.name} ({self.node}) log ---\n{self.log_tail()}"

    def __repr__(self) -> str:
        return f"<RedisProcess {self.name} {self.node} running={self.running}>"


# -- what every topology shares ---------------------------------------------------------------

_LIVE: weakref.WeakSet[_Topology] = weakref.WeakSet()


@atexit.register
def _close_leftovers() -> None:
    """A last resort (an interrupted run): end the processes of any topology not closed."""
    for topology in list(_LIVE):
        topology.close()


class _Topology:
    def __init__(self, prefix: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self._processes: list[RedisProcess] = []
        _LIVE.add(self)

    def _process(
        self,
        name: str,
        config: Callable[[RedisProcess], list[str]],
        *,
        sentinel: bool = False,
        password: str | None = None,
        after_start: Callable[[RedisProcess], None] | None = None,
    ) -> RedisProcess:
        process = RedisProcess(
            name,
            self.dir / name,
            config,
            sentinel=sentinel,
            password=password,
            after_start=after_start,
        )
        self._processes.append(process)
        return process

    def logs(self) -> str:
        return "".join(process.logs() for process in self._processes)

    def stop(self) -> None:
        """End every process (thawed first). The temp dir stays: start() may follow."""
        for process in self._processes:
            process.thaw()
        for process in reversed(self._processes):
            process.stop()

    def close(self) -> None:
        """End every process and remove the temp dir."""
        try:
            self.stop()
        finally:
            for process in self._processes:
                process.kill()
            shutil.rmtree(self.dir, ignore_errors=True)
            _LIVE.discard(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _data_node_config(password: str | None) -> list[str]:
    lines = [
        'save ""',
        "appendonly no",
        # a primary with a stopped or frozen replica must not wait on SIGTERM
        "shutdown-timeout 0",
        "repl-diskless-sync-delay 0",
    ]
    if password is not None:
        lines += [f"requirepass {_quote(password)}", f"masterauth {_quote(password)}"]
    return lines


# -- Redis Cluster ----------------------------------------------------------------------------


class RedisCluster(_Topology):
    """Three Redis Cluster primaries, no replicas, all 16384 slots assigned.

    ``nodes`` are the ``"127.0.0.1:port"`` of the primaries, ``servers`` their
    :class:`RedisProcess` handles (freeze/thaw/stop/kill/start). ``password``, when given,
    is every node's ``requirepass`` and ``masterauth``.
    """

    NODE_TIMEOUT_MS = 2000

    def __init__(self, *, password: str | None = None, size: int = 3) -> None:
        super().__init__("rg-redis-cluster-")
        self.password = password
        self.servers = [
            self._process(f"node{index}", self._config, password=password) for index in range(size)
        ]

    def _config(self, process: RedisProcess) -> list[str]:
        return [
            *_data_node_config(self.password),
            "cluster-enabled yes",
            "cluster-config-file nodes.conf",
            f"cluster-node-timeout {self.NODE_TIMEOUT_MS}",
            f"cluster-port {process.bus_port}",
        ]

    @property
    def nodes(self) -> list[str]:
        return [server.node for server in self.servers]

    @property
    def ports(self) -> list[int]:
        return [server.port for server in self.servers]

    @property
    def addresses(self) -> list[Address]:
        return [server.address for server in self.servers]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the nodes, create the cluster on the first start, and wait until every
        node reports ``cluster_state:ok`` with all slots assigned. A failure closes the
        topology (processes and temp dir) before it raises."""
        try:
            created = all(server.config_file.exists() for server in self.servers)
            for server in self.servers:
                server.start(timeout_s)
            if not created:
                self._create(timeout_s)
            self.wait_ready(timeout_s)
        except BaseException:
            self.close()
            raise

    def _create(self, timeout_s: float) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed (Debian's redis-tools)")
        env = dict(os.environ)
        env.pop("REDISCLI_AUTH", None)
        if self.password is not None:
            env["REDISCLI_AUTH"] = self.password  # not -a: no password in the process list
        args = [cli, "--cluster", "create", *self.nodes, "--cluster-replicas", "0"]
        result = subprocess.run(
            [*args, "--cluster-yes"],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
        if result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace")
            raise TopologyError(
                f"redis-cli --cluster create failed ({result.returncode}):\n{output}{self.logs()}"
            )

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until every node says ``cluster_state:ok``, knows every node and sees all
        16384 slots assigned and ok."""

        def ready() -> bool:
            for server in self.servers:
                info = _info(server.command("CLUSTER", "INFO"))
                if (
                    info.get("cluster_state") != "ok"
                    or info.get("cluster_slots_assigned") != "16384"
                    or info.get("cluster_slots_ok") != "16384"
                    or info.get("cluster_known_nodes") != str(len(self.servers))
                ):
                    return False
            return True

        _wait("the cluster's state ok on every node", ready, timeout_s, self.logs)

    def flush(self) -> None:
        """FLUSHALL on every primary."""
        for server in self.servers:
            server.command("FLUSHALL", "SYNC", timeout_s=5)

    def reset(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Undo what a test did to the nodes: thaw the frozen, start the stopped, wait for
        the cluster's state ok, then flush it."""
        for server in self.servers:
            server.thaw()
        for server in self.servers:
            if not server.running:
                server.start(timeout_s)
        self.wait_ready(timeout_s)
        self.flush()

    def dbsizes(self) -> dict[str, int]:
        """DBSIZE of every node, by ``"127.0.0.1:port"``."""
        sizes: dict[str, int] = {}
        for server in self.servers:
            size = server.command("DBSIZE")
            assert isinstance(size, int)
            sizes[server.node] = size
        return sizes

    def server_at(self, node: str | Address) -> RedisProcess:
        """The handle of the node at ``"host:port"`` or ``(host, port)``."""
        address = _address(node) if isinstance(node, str) else node
        for server in self.servers:
            if server.address == address:
                return server
        raise KeyError(node)


# -- Sentinel ---------------------------------------------------------------------------------


class SentinelSet(_Topology):
    """One primary, one replica, three Sentinels monitoring them as ``master_name``
    (quorum 2, down after 1 s, failover timeout 5 s).

    ``password`` is the data nodes' ``requirepass``/``masterauth`` and the Sentinels'
    ``auth-pass``; ``sentinel_password``, when given, is the Sentinels' own ``requirepass``
    (otherwise they take none). ``data_nodes`` are the handles of the data nodes (the first
    started as the primary; :meth:`primary` and :meth:`replica` say which is which now),
    ``sentinel_nodes`` the Sentinels' handles, ``sentinels`` their ``"127.0.0.1:port"``.
    """

    DOWN_AFTER_MS = 1000
    FAILOVER_TIMEOUT_MS = 5000
    # SENTINEL DEBUG timings (not kept in the config file: set again on every start).
    # Sentinel's defaults poll a replica's INFO every 10 s and demote a returning old
    # primary only on such a poll, so a forced failover would end 10-20 s after it began;
    # with these it ends in 2-4 s. TILT (Sentinel pauses itself after its timer ran late,
    # e.g. after SIGSTOP or a loaded machine) lasts 5 s instead of 30.
    SENTINEL_DEBUG: tuple[tuple[str, int], ...] = (
        ("info-period", 1000),
        ("publish-period", 500),
        ("tilt-period", 5000),
    )

    def __init__(
        self,
        *,
        master_name: str = "gwmaster",
        password: str | None = None,
        sentinel_password: str | None = None,
    ) -> None:
        super().__init__("rg-redis-sentinel-")
        self.master_name = master_name
        self.password = password
        self.sentinel_password = sentinel_password
        first = self._process("data0", self._primary_config, password=password)
        second = self._process("data1", self._replica_config, password=password)
        self.data_nodes = [first, second]
        self.sentinel_nodes = [
            self._process(
                f"sentinel{index}",
                self._sentinel_config,
                sentinel=True,
                password=sentinel_password,
                after_start=self._tune_sentinel,
            )
            for index in range(3)
        ]

    def _primary_config(self, process: RedisProcess) -> list[str]:
        return _data_node_config(self.password)

    def _replica_config(self, process: RedisProcess) -> list[str]:
        primary = self.data_nodes[0]
        return [*_data_node_config(self.password), f"replicaof {HOST} {primary.port}"]

    def _tune_sentinel(self, sentinel: RedisProcess) -> None:
        settings = [str(part) for pair in self.SENTINEL_DEBUG for part in pair]
        if settings:
            sentinel.command("SENTINEL", "DEBUG", *settings)

    def _sentinel_config(self, process: RedisProcess) -> list[str]:
        name = self.master_name
        lines = [
            f"sentinel monitor {name} {HOST} {self.data_nodes[0].port} 2",
            f"sentinel down-after-milliseconds {name} {self.DOWN_AFTER_MS}",
            f"sentinel failover-timeout {name} {self.FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {name} 1",
        ]
        if self.password is not None:
            lines.append(f"sentinel auth-pass {name} {_quote(self.password)}")
        if self.sentinel_password is not None:
            lines.append(f"requirepass {_quote(self.sentinel_password)}")
        return lines

    @property
    def sentinels(self) -> list[str]:
        return [sentinel.node for sentinel in self.sentinel_nodes]

    @property
    def sentinel_addresses(self) -> list[Address]:
        return [sentinel.address for sentinel in self.sentinel_nodes]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the primary, the replica (and wait for its link up), then the Sentinels,
        and wait until every Sentinel knows the master, the replica and the two others.
        A failure closes the topology (processes and temp dir) before it raises."""
        try:
            primary, replica = self.data_nodes
            primary.start(timeout_s)
            replica.start(timeout_s)
            _wait(
                "the replica's link to the primary up",
                lambda: _role(replica) == ("slave", primary.address),
                timeout_s,
                self.logs,
            )
            for sentinel in self.sentinel_nodes:
                sentinel.start(timeout_s)
            self.wait_ready(timeout_s)
        except BaseException:
            self.close()
            raise

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until every Sentinel sees the master up with every other data node as an
        up replica, and knows the other Sentinels (Sentinels and data nodes that a test
        stopped or froze left out)."""

        def ready() -> bool:
            master = self.master_address()
            replicas = {
                node.address for node in self.data_nodes if node.live and node.address != master
            }
            for sentinel in self._live_sentinels():
                state = _fields(sentinel.command("SENTINEL", "MASTER", self.master_name))
                if (state["ip"], int(state["port"])) != master or state["flags"] != "master":
                    return False
                if int(state["num-other-sentinels"]) != len(self.sentinel_nodes) - 1:
                    return False
                seen = {
                    (replica["ip"], int(replica["port"]))
                    for replica in _records(
                        sentinel.command("SENTINEL", "REPLICAS", self.master_name)
                    )
                    if replica["flags"] == "slave" and replica["master-link-status"] == "ok"
                }
                if not replicas <= seen:
                    return False
            return True

        _wait("every Sentinel ready", ready, timeout_s, self.logs)

    def _live_sentinels(self) -> list[RedisProcess]:
        return [sentinel for sentinel in self.sentinel_nodes if sentinel.live]

    def _ask_sentinels(self, *args: str | int) -> Reply:
        """The reply of the first Sentinel that answers."""
        error: Exception | None = None
        for sentinel in self._live_sentinels():
            try:
                return sentinel.command(*args, timeout_s=1.0)
            except OSError as failure:
                error = failure
        raise TopologyError(f"no Sentinel answered {args[:2]}: {error}")

    def master_address(self) -> Address:
        """The primary's address, as a Sentinel says it."""
        return _address_reply(
            self._ask_sentinels("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
        )

    def node_at(self, address: Address) -> RedisProcess:
        """The handle of the data node at ``address``."""
        for node in self.data_nodes:
            if node.address == address:
                return node
        raise KeyError(address)

    def primary(self) -> RedisProcess:
        """The handle of the data node the Sentinels say is the primary now."""
        return self.node_at(self.master_address())

    def replica(self) -> RedisProcess:
        """The handle of the other data node."""
        primary = self.master_address()
        return next(node for node in self.data_nodes if node.address != primary)

    def failover(self, timeout_s: float = 30.0, *, wait_for_old_primary: bool = True) -> Address:
        """``SENTINEL FAILOVER`` and wait until every Sentinel reports the new primary,
        it answers ROLE as master and (unless ``wait_for_old_primary`` is off, for an old
        primary frozen or killed) the old primary is its connected replica and the
        Sentinels list it as an up replica again. Returns the new primary's address.
        Sentinels that a test froze or stopped are neither asked nor waited for."""
        deadline = time.monotonic() + timeout_s
        old = self.master_address()
        old_node = self.node_at(old)

        def sent() -> bool:
            try:
                self._ask_sentinels("SENTINEL", "FAILOVER", self.master_name)
            except RespError as error:  # NOGOODSLAVE or INPROG: the replica is not ready
                if "NOGOODSLAVE" in str(error) or "INPROG" in str(error):
                    return False
                raise
            return True

        _wait("SENTINEL FAILOVER accepted", sent, deadline - time.monotonic(), self.logs)
        new: list[Address] = []

        def switched() -> bool:
            addresses = {
                _address_reply(
                    sentinel.command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
                )
                for sentinel in self._live_sentinels()
            }
            if len(addresses) != 1 or old in addresses:
                return False
            (address,) = addresses
            new[:] = [address]
            return _role(self.node_at(address))[0] == "master"

        _wait("every Sentinel on the new primary", switched, deadline - time.monotonic(), self.logs)
        if wait_for_old_primary:
            _wait(
                "the old primary a connected replica of the new one",
                lambda: _role(old_node) == ("slave", new[0]),
                deadline - time.monotonic(),
                self.logs,
            )
            self.wait_ready(deadline - time.monotonic())
        return new[0]


def _address_reply(reply: Reply) -> Address:
    """The [host, port] of GET-MASTER-ADDR-BY-NAME (nil: a master the Sentinel does not
    know, a ValueError that a wait takes for "not yet")."""
    if not isinstance(reply, list) or len(reply) != 2:
        raise ValueError(f"not an address: {reply!r}")
    return _text(reply[0]), int(_text(reply[1]))


def _role(node: RedisProcess) -> tuple[str, Address | None]:
    """("master", None), or ("slave", primary) once the replica's link is connected
    (("slave", None) before)."""
    reply = node.command("ROLE", timeout_s=1.0)
    if not isinstance(reply, list) or not reply:
        raise TopologyError(f"odd ROLE reply: {reply!r}")
    role = _text(reply[0])
    if role == "slave" and len(reply) >= 4 and reply[3] == "connected":
        port = reply[2]
        assert isinstance(port, int)
        return role, (_text(reply[1]), port)
    return role, None
