"""Reading the config file within its bounds: gateway.config.tomlfile (docs/operations.md,
"Reload without a restart")."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

from gateway.config.live import ConfigSource
from gateway.config.tomlfile import (
    MAX_FILE_BYTES,
    ParseBounds,
    read_toml,
    read_toml_bounded,
)
from gateway.errors import ConfigError

# one dotted key of 12,000 parts: quadratic in time and memory for tomllib
HOSTILE = "a" + ".a" * 11_999 + " = 1\n"

ORDINARY = """
when = 2026-01-02T03:04:05.678+01:30
day = 2026-01-02
at = 07:08:09
local = 2026-01-02T03:04:05
ratio = 0.25
big = 12345678901234567890
inf = inf
words = ["a", 'b', \"\"\"c\"\"\"]
mixed = [1, [2, 3], {x = 1}]
[cache.ttl_s]
users = 300
[[list]]
name = "one"
[[list]]
name = "two"
"""


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "config.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


async def test_a_file_parsed_off_the_loop_is_what_tomllib_parses(tmp_path: Path) -> None:
    path = write(tmp_path, ORDINARY)
    parsed = await read_toml_bounded(path, ParseBounds())
    assert parsed == tomllib.loads(ORDINARY)
    assert parsed == read_toml(path)
    assert type(parsed["when"]) is type(tomllib.loads(ORDINARY)["when"])


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[server\n", "not valid TOML: "),
        (b'[log]\nlevel = "w\xe4rning"\n', "not UTF-8 text ("),
        ("a = " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
        # parsed without recursion, too deep for the settings' checks to walk
        ("[" + ".".join(["a"] * 3000) + "]\n", "nested too deeply"),
    ],
)
async def test_a_refused_file_is_refused_alike_at_start_and_on_a_reload(
    tmp_path: Path, text: str | bytes, reason: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as off_loop:
        await read_toml_bounded(path, ParseBounds())
    assert str(off_loop.value).startswith(f"config file {path}: {reason}")
    if "[a.a" in str(text):
        return  # at start, nothing is walked but what the settings know
    with pytest.raises(ConfigError) as at_start:
        read_toml(path)
    assert str(at_start.value) == str(off_loop.value)


def test_a_reload_parses_within_5_s_and_256_mib_unless_told_otherwise() -> None:
    assert ConfigSource(Path("config.toml")).bounds == ParseBounds(
        timeout_s=5.0, max_memory_bytes=256 * 1024 * 1024
    )


async def test_parsing_over_the_memory_bound_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, HOSTILE)
    with pytest.raises(ConfigError) as caught:
        await read_toml_bounded(path, ParseBounds(timeout_s=60, max_memory_bytes=128 * 2**20))
    assert str(caught.value) == (
        f"config file {path}: parsing it needed more than 128 MiB"
        " (the bound on parsing a config file)"
    )


async def test_parsing_over_the_time_bound_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, HOSTILE)
    # memory enough to go on for seconds; killed at the time bound
    with pytest.raises(ConfigError) as caught:
        await read_toml_bounded(path, ParseBounds(timeout_s=0.25, max_memory_bytes=2**31))
    assert str(caught.value) == (
        f"config file {path}: parsing it took longer than 0.25 s"
        " (the bound on parsing a config file)"
    )


async def test_a_file_over_the_size_bound_is_refused_at_start_and_on_a_reload(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "#" * MAX_FILE_BYTES + "\n")
    message = f"config file {path}: larger than 1 MiB (1048576 bytes), the bound on a config file"
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        read_toml(path)
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        await read_toml_bounded(path, ParseBounds())


async def test_a_named_pipe_is_refused_on_a_reload_without_waiting_for_a_writer(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.toml"
    os.mkfifo(path)
    with pytest.raises(ConfigError) as caught:
        await read_toml_bounded(path, ParseBounds())
    assert str(caught.value) == f"config file {path}: not a regular file"
