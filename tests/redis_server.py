"""A real redis-server, started by the test suite on a free loopback port."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One redis-server process: no persistence, loopback only."""

    def __init__(self, *extra_args: str) -> None:
        """``extra_args``: more redis-server options (e.g. a TLS port)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: run `make test`, which installs it")
        self.binary = binary
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="rg-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.extra_args = list(extra_args)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--protected-mode",
                "yes",
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.thaw()
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def freeze(self) -> None:
        """SIGSTOP: the socket still accepts, nothing answers."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
