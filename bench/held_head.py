"""The CPU a gateway spends on one request head of about 60 KB sent a byte at a time:
the caching gateway with the fast path, against the same gateway with caching off
(no hit to look for: the fast path only frames the heads it hands aiohttp one by one)
and with the fast path off (every byte goes straight to aiohttp's parser).

Each gateway is a process of its own (``python -m gateway serve``) in front of the
reference upstream; its CPU time is read from /proc before and after the head is sent.
Run from the repository's root: ``.venv/bin/python bench/held_head.py``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "demo-token"
HEAD = (
    b"GET /users?limit=3 HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer "
    + TOKEN.encode()
    + b"\r\n"
    + b"".join(b"X-Filler-%03d: %s\r\n" % (i, b"f" * 580) for i in range(100))
    + b"\r\n"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


async def trickle(port: int, rounds: int) -> None:
    for _ in range(rounds):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for i in range(len(HEAD)):
            writer.write(HEAD[i : i + 1])
            await writer.drain()
        answer = await reader.readuntil(b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200"), answer[:60]
        writer.close()


def measure(upstream: str, backend: str, fast_path: bool, rounds: int) -> float:
    port = free_port()
    config = Path(tempfile.mkdtemp()) / "config.toml"
    config.write_text(
        f'[upstream]\nbase_url = "{upstream}"\n[cache]\nbackend = "{backend}"\n'
        f"[server]\nfast_path = {str(fast_path).lower()}\n[log]\naccess = false\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    gateway = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        asyncio.run(trickle(port, 1))  # warm: imports, first connection
        before = cpu_seconds(gateway.pid)
        asyncio.run(trickle(port, rounds))
        return (cpu_seconds(gateway.pid) - before) / rounds
    finally:
        gateway.terminate()
        gateway.wait(10)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    upstream_port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo-upstream", "--port", str(upstream_port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(upstream_port)
        url = f"http://127.0.0.1:{upstream_port}"
        results = {
            "caching, fast path": measure(url, "memory", True, rounds),
            "caching off": measure(url, "none", True, rounds),
            "caching, fast path off": measure(url, "memory", False, rounds),
        }
    finally:
        upstream.terminate()
        upstream.wait(10)
    print(f"one {len(HEAD)}-byte head sent a byte at a time, gateway CPU per head:")
    base = results["caching off"]
    for name, seconds in results.items():
        print(f"  {name:<24} {seconds:6.3f} s  ({seconds / base:.2f}x caching off)")


if __name__ == "__main__":
    main()
