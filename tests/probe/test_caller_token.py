"""The caller token of ``probe`` and ``compare``: from --token-file or
RECORDS_GATEWAY_TOKEN, out of the process list (docs/install.md, "Subcommands"), and what each
wrong source says."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from gateway.demo import start_demo_server
from gateway.errors import ConfigError
from gateway.probe.caller_token import TOKEN_ENV, caller_token
from tests.conftest import TOKEN, base_url

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cret-caller-token-0123"


def env_for(upstream_url: str, **extra: str) -> dict[str, str]:
    """The environment of a command: this one's without GATEWAY_* or a token, and
    ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_") and k != TOKEN_ENV}
    return {**env, "GATEWAY_UPSTREAM__BASE_URL": upstream_url, **extra}


async def start_command(env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )


async def run_command(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    process = await start_command(env, *args)
    out, err = await asyncio.wait_for(process.communicate(), timeout=45)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


# The rules, in process


def test_a_flag_wins_over_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "token"
    file.write_text("from-file\n")
    environ = {TOKEN_ENV: "from-env"}
    assert caller_token("from-flag", None, environ) == "from-flag"
    assert caller_token(None, file, environ) == "from-file"
    assert caller_token(None, None, environ) == "from-env"


@pytest.mark.parametrize(
    ("content", "token"),
    [(b"tok", "tok"), (b"tok\n", "tok"), (b"tok\r\n", "tok"), ("t\u00f6k\n".encode(), "t\u00f6k")],
)
def test_a_token_file_loses_one_trailing_line_break(
    tmp_path: Path, content: bytes, token: str
) -> None:
    file = tmp_path / "token"
    file.write_bytes(content)
    assert caller_token(None, file, {}) == token


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it (No such file or directory)"),
        (b"", "the bearer token is empty"),
        (b"\n", "the bearer token is empty"),
        (b"tok\n\n", "the bearer token has white space at an end"),
        (b" tok", "the bearer token has white space at an end"),
        (b"tok\nen\n", "control characters"),
        (b"\xff\xfe", "not UTF-8 text"),
        (b"x" * 70_000, "larger than 65536 bytes; not a token"),
    ],
)
def test_a_token_file_that_holds_no_token_is_a_config_error_naming_it(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    file = tmp_path / "token"
    if content is not None:
        file.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        caller_token(None, file, {TOKEN_ENV: "from-env"})
    assert str(caught.value).startswith(f"--token-file {file}: ")
    assert message in str(caught.value)
    assert caught.value.where == {"path": str(file)}


def test_a_folder_as_the_token_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        caller_token(None, tmp_path, {})


def test_no_token_anywhere_says_where_to_give_one() -> None:
    with pytest.raises(ConfigError) as caught:
        caller_token(None, None, {"OTHER": "x"})
    assert str(caught.value) == (
        f"no bearer token: give --token-file PATH or set {TOKEN_ENV}"
        " (or --token T, which other users of the machine can see)"
    )


def test_an_empty_environment_variable_is_no_token() -> None:
    with pytest.raises(ConfigError, match=f"^{TOKEN_ENV}: the bearer token is empty$"):
        caller_token(None, None, {TOKEN_ENV: ""})


# The commands, run


async def test_probe_takes_the_token_from_a_file_and_from_the_environment(
    tmp_path: Path,
) -> None:
    file = tmp_path / "token"
    file.write_text(TOKEN + "\n")
    async with await start_demo_server(port=0) as server:
        from_file = await run_command(env_for(server.url), "probe", "--token-file", str(file))
        from_env = await run_command(env_for(server.url, **{TOKEN_ENV: TOKEN}), "probe")
    for code, out, err in (from_file, from_env):
        assert code == 0, err
        assert out.rstrip().endswith("Exit 0: every route probed normalises.")
        assert TOKEN not in out + err


async def test_probe_without_a_token_or_with_a_bad_file_is_one_line_and_exit_2(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "nope"
    empty = tmp_path / "empty"
    empty.write_text("\n")
    async with await start_demo_server(port=0) as server:
        env = env_for(server.url)
        runs = {
            "none": await run_command(env, "probe"),
            "missing": await run_command(env, "probe", "--token-file", str(missing)),
            "empty": await run_command(env, "probe", "--token-file", str(empty)),
        }
        both = await run_command(env, "probe", "--token", "x", "--token-file", str(empty))
    prefix = "records-gateway probe: "
    assert runs == {
        "none": (
            2,
            "",
            prefix + f"no bearer token: give --token-file PATH or set {TOKEN_ENV}"
            " (or --token T, which other users of the machine can see)\n",
        ),
        "missing": (
            2,
            "",
            prefix + f"--token-file {missing}: cannot read it (No such file or directory)\n",
        ),
        "empty": (2, "", prefix + f"--token-file {empty}: the bearer token is empty\n"),
    }
    assert both[0] == 2
    assert "not allowed with argument" in both[2]


async def test_compare_takes_the_token_from_a_file(tmp_path: Path) -> None:
    file = tmp_path / "token"
    file.write_text(SECRET + "\n")
    tokens = frozenset({SECRET})
    async with (
        await start_demo_server(tokens=tokens, port=0) as primary,
        await start_demo_server(tokens=tokens, port=0) as candidate,
    ):
        code, out, err = await run_command(
            env_for(primary.url),
            "compare",
            "--candidate",
            candidate.url,
            "--token-file",
            str(file),
        )
        without = await run_command(env_for(primary.url), "compare", "--candidate", candidate.url)
    assert code == 0, err
    assert SECRET not in out + err
    assert without[0] == 2
    assert without[2].startswith("records-gateway compare: no bearer token")


@pytest.mark.parametrize("source", ["file", "environment"])
async def test_a_running_probe_shows_no_token_in_its_command_line(
    aiohttp_server: AiohttpServer, tmp_path: Path, source: str
) -> None:
    """What ``ps`` shows of the process while it sends the token upstream."""
    received: list[str] = []
    arrived = asyncio.Event()
    release = asyncio.Event()

    async def hold(request: web.Request) -> web.Response:
        authorization = request.headers.get("Authorization")
        if authorization is not None:  # the reachability check before sends none
            received.append(authorization)
            arrived.set()
            await release.wait()
        return web.json_response({"error": "no"}, status=401)

    app = web.Application()
    app.router.add_get("/{tail:.*}", hold)
    upstream = await aiohttp_server(app)
    file = tmp_path / "token"
    file.write_text(SECRET + "\n")
    args: tuple[str, ...] = ()
    if source == "file":
        env, args = env_for(base_url(upstream)), ("--token-file", str(file))
    else:
        env = env_for(base_url(upstream), **{TOKEN_ENV: SECRET})
    process = await start_command(env, "probe", *args)
    try:
        await asyncio.wait_for(arrived.wait(), timeout=30)
        cmdline = await asyncio.to_thread(Path(f"/proc/{process.pid}/cmdline").read_bytes)
    finally:
        release.set()
    out, err = await asyncio.wait_for(process.communicate(), timeout=45)
    assert received[0] == f"Bearer {SECRET}"
    assert cmdline.endswith(b"\x00probe\x00" + b"".join(a.encode() + b"\x00" for a in args))
    assert SECRET.encode() not in cmdline
    assert process.returncode == 1
    assert SECRET not in (out + err).decode()
