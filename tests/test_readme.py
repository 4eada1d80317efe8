"""The README's first screen: four lines of what the gateway does, the two commands,
and one curl whose answer is the gateway's, byte for byte."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient
from yarl import URL

README = Path(__file__).resolve().parent.parent / "README.md"
Gateway = TestClient[web.Request, web.Application]


def _first_screen() -> tuple[list[str], str, str]:
    """(the lines before the first code block, the first block, the second block)."""
    text = README.read_text(encoding="utf-8")
    match = re.match(
        r"# records-gateway\n\n(?P<intro>.*?)\n\n```sh\n(?P<commands>.*?)```\n\n"
        r"```console\n(?P<curl>.*?)```\n",
        text,
        flags=re.DOTALL,
    )
    assert match is not None, "the README does not open with intro, commands and a curl"
    return match["intro"].splitlines(), match["commands"], match["curl"]


def test_the_first_screen_is_four_lines_then_the_two_commands() -> None:
    intro, commands, _ = _first_screen()
    assert len(intro) == 4
    assert [line.split("#")[0].strip() for line in commands.splitlines()] == [
        "make run",
        "make test",
    ]


async def test_the_first_screen_curl_answers_what_it_shows(gateway: Gateway) -> None:
    """The gateway in front of the reference upstream (what `make run` starts)
    answers the README's curl with the very bytes shown."""
    _, _, block = _first_screen()
    command, shown = block.splitlines()
    words = shlex.split(command.removeprefix("$ "))
    assert words[:2] == ["curl", "-s"]
    header = words[words.index("-H") + 1]
    name, _, value = header.partition(": ")
    url = URL(words[-1])
    assert (url.host, url.port) == ("127.0.0.1", 8080)
    response = await gateway.get(url.path_qs, headers={name: value})
    assert response.status == 200
    assert await response.read() == shown.encode()


def test_the_readme_is_a_short_page() -> None:
    """At most 200 lines: the reference is the documentation site's."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


def test_the_site_s_index_shows_the_same_curl_and_answer() -> None:
    """docs/index.md, "Try it": the same command and bytes as the README's, which the test
    above asks of the gateway."""
    _, _, curl = _first_screen()
    index = (README.parent / "docs" / "index.md").read_text(encoding="utf-8")
    assert f"```console\n{curl}```" in index
