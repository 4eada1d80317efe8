"""How the gateway is installed: the lock files of requirements/ (written by `make lock`),
the installs of the Makefile and of the Dockerfile that use them, and the image's build
context. A lock that drifted from pyproject.toml, or an install that goes around it,
fails here rather than in an install a month later."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements"
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
PYTHONS = ["3.11", "3.12", "3.13"]
PLATFORMS = {"linux": "Linux", "darwin": "Darwin", "win32": "Windows"}


@dataclass(frozen=True, slots=True)
class Pin:
    """One line of a lock: ``name==version ; marker --hash=... --hash=...``."""

    name: str
    version: Version
    marker: Marker | None
    hashes: tuple[str, ...]

    def installs_in(self, environment: dict[str, str]) -> bool:
        return self.marker is None or self.marker.evaluate(environment)


def read_lock(name: str) -> dict[str, list[Pin]]:
    """The pins of requirements/NAME by package name (a package the resolution forked
    on, a Python version say, has a pin for each branch, told apart by their markers)."""
    text = (REQUIREMENTS / name).read_text().replace("\\\n", " ")
    pins: dict[str, list[Pin]] = defaultdict(list)
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *hashes = re.split(r"\s+--hash=", line)
        requirement = Requirement(spec)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"{name}: {line}"
        pin = Pin(
            canonicalize_name(requirement.name),
            Version(specifier.version),
            requirement.marker,
            tuple(hashes),
        )
        pins[pin.name].append(pin)
    return pins


def environments() -> list[dict[str, str]]:
    """The environments the project supports: every Python it names on three platforms."""
    return [
        {
            "python_version": python,
            "python_full_version": f"{python}.0",
            "sys_platform": platform,
            "platform_system": system,
        }
        for python in PYTHONS
        for platform, system in PLATFORMS.items()
    ]


def requirements(*extras: str) -> list[Requirement]:
    project = PYPROJECT["project"]
    listed = [*project["dependencies"]]
    for extra in extras:
        listed += project["optional-dependencies"][extra]
    return [Requirement(item) for item in listed]


# each lock and what it must hold: the build requirements (and the pip that installs
# with them), the dependencies, those with the otel extra, those with the docs extra
# (the site's), and those with the otel, docs and test extras, in the order `make lock`
# writes them
LOCKS = {
    "build.txt": [Requirement(item) for item in [*PYPROJECT["build-system"]["requires"], "pip"]],
    "run.txt": requirements(),
    "otel.txt": requirements("otel"),
    "docs.txt": requirements("docs"),
    "test.txt": requirements("otel", "docs", "test"),
}


@pytest.mark.parametrize(("lock", "wanted"), LOCKS.items(), ids=list(LOCKS))
def test_every_requirement_of_pyproject_is_pinned_with_hashes_in_its_lock(
    lock: str, wanted: list[Requirement]
) -> None:
    pins = read_lock(lock)
    unhashed = [pin.name for found in pins.values() for pin in found if not pin.hashes]
    assert unhashed == [], f"{lock}: pins with no hash"
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{lock} has no {requirement}: run `make lock`"
        for pin in pins[name]:
            assert requirement.specifier.contains(pin.version, prereleases=True), (
                f"{lock} pins {name}=={pin.version}, which pyproject's {requirement} does not"
                " allow: run `make lock`"
            )
        # exactly one version wherever pyproject asks for the package, none elsewhere
        for environment in environments():
            asked = requirement.marker is None or requirement.marker.evaluate(environment)
            installed = [pin.version for pin in pins[name] if pin.installs_in(environment)]
            assert len(installed) == int(asked), (lock, name, environment, installed)


@pytest.mark.parametrize(
    ("lower", "upper"),
    [
        ("run.txt", "otel.txt"),
        ("run.txt", "docs.txt"),
        ("otel.txt", "test.txt"),
        ("docs.txt", "test.txt"),
    ],
)
def test_a_lock_pins_what_the_one_below_it_does_at_the_same_versions(
    lower: str, upper: str
) -> None:
    below, above = read_lock(lower), read_lock(upper)
    assert len(below) > 15
    for name, pins in below.items():
        assert above.get(name) == pins, f"{name}: {upper} {above.get(name)}, {lower} {pins}"


def make(*args: str) -> subprocess.CompletedProcess[str]:
    """GNU make on the project's Makefile, free of the flags of any make that runs the tests."""
    binary = shutil.which("make")
    if binary is None:
        pytest.fail("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    return subprocess.run(
        [binary, "--no-print-directory", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("stamp", "lock"),
    [(".installed-run", "run"), (".installed-docs", "docs"), (".installed-test", "test")],
)
def test_make_installs_from_the_locks_with_hashes_and_the_project_alone(
    tmp_path: Path, stamp: str, lock: str
) -> None:
    venv = tmp_path / "venv"
    result = make("--dry-run", "--always-make", f"VENV={venv}", f"{venv}/{stamp}")
    assert result.returncode == 0, result.stderr
    installs = [line for line in result.stdout.splitlines() if " pip install " in line]
    pip = f"{venv}/bin/python -m pip install --quiet"
    assert installs == [
        f"{pip} --require-hashes -r requirements/build.txt",
        f"{pip} --require-hashes -r requirements/{lock}.txt",
        f"{pip} --no-deps --no-build-isolation -e .",
    ]


@pytest.mark.parametrize(
    ("stamp", "changed", "installs_again"),
    [
        (".installed-run", "requirements/run.txt", True),
        (".installed-run", "requirements/build.txt", True),
        (".installed-run", "requirements/test.txt", False),
        (".installed-run", "gateway/normalise/compiled.pyx", True),
        (".installed-test", "requirements/test.txt", True),
        (".installed-test", "requirements/run.txt", True),
        (".installed-test", "requirements/build.txt", True),
        (".installed-test", "pyproject.toml", True),
        (".installed-docs", "requirements/docs.txt", True),
        (".installed-docs", "requirements/test.txt", False),
    ],
)
def test_a_changed_lock_installs_again(
    tmp_path: Path, stamp: str, changed: str, installs_again: bool
) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / stamp).touch()
    target = f"{venv}/{stamp}"
    assert make("--question", f"VENV={venv}", target).returncode == 0  # up to date
    result = make("--question", f"--what-if={changed}", f"VENV={venv}", target)
    assert result.returncode == (1 if installs_again else 0), result.stderr


def test_make_lock_resolves_for_every_supported_python_and_platform(tmp_path: Path) -> None:
    result = make("--dry-run", f"VENV={tmp_path / 'venv'}", "lock")
    assert result.returncode == 0, result.stderr
    compiles = [line for line in result.stdout.splitlines() if " pip compile " in line]
    outputs = [re.search(r" -o (\S+)", line) for line in compiles]
    assert [found.group(1) if found else None for found in outputs] == [
        f"requirements/{name}" for name in LOCKS
    ]
    # the oldest Python pyproject supports, where the environments above start
    (oldest,) = SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert oldest.operator == ">="
    assert oldest.version == PYTHONS[0]
    for line in compiles:
        assert f"--universal --python-version {oldest.version} --generate-hashes" in line
    assert "-c requirements/run.txt -o requirements/otel.txt" in compiles[2]
    assert "--extra docs -c requirements/otel.txt -o requirements/docs.txt" in compiles[3]
    assert (
        "-c requirements/otel.txt -c requirements/docs.txt -o requirements/test.txt" in compiles[4]
    )


DOCKERFILE = ROOT / "Dockerfile"


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, arguments), continuation lines
    joined; each comment line is kept as ``("#", text)``, as hadolint reads
    ``# hadolint ignore=...`` before the instruction it is for."""
    instructions: list[tuple[str, str]] = []
    for line in DOCKERFILE.read_text().replace("\\\n", " ").splitlines():
        if line.startswith("#"):
            instructions.append(("#", line[1:].strip()))
        elif line.strip():
            keyword, _, arguments = line.strip().partition(" ")
            instructions.append((keyword.upper(), " ".join(arguments.split())))
    return instructions


def shell_commands() -> list[str]:
    """Every command of every RUN (they are joined with ``&&``)."""
    return [
        command.strip()
        for keyword, arguments in dockerfile()
        if keyword == "RUN"
        for command in arguments.split("&&")
    ]


def test_the_image_installs_its_python_packages_from_the_locks_with_hashes() -> None:
    pips = [
        command for command in shell_commands() if re.search(r"\bpip (install|wheel)\b", command)
    ]
    assert sorted(re.findall(r" -r (\S+)", " ".join(pips))) == [
        "requirements/build.txt",
        "requirements/run.txt",
    ]
    for command in pips:
        if " -r " in command:
            assert "--require-hashes" in command, command
        else:  # the project's own wheel, whose dependencies come from the lock alone
            assert "--no-deps" in command, command
    (wheel,) = [command for command in pips if re.search(r"\bpip wheel\b", command)]
    assert "--no-build-isolation" in wheel  # built with build.txt's setuptools and Cython
    runtime = [command for command in pips if command.startswith("/opt/records-gateway/")]
    assert [command.split(" install ", 1)[1] for command in runtime] == [
        "--require-hashes -r requirements/run.txt",
        "--no-deps /wheels/records_gateway-*.whl",
    ]


DEBIAN_VERSION = re.compile(r"(\d+:)?\d[\w.+~-]*")
# installed at the archive's version, for the reason the Dockerfile's header gives
UNPINNED = {"libc6-dev"}


def test_the_image_pins_its_debian_packages_or_says_why_not() -> None:
    instructions = dockerfile()
    defaults = {}
    for keyword, arguments in instructions:
        if keyword == "ARG":
            name, _, value = arguments.partition("=")
            defaults[name] = value
    versions: dict[str, str] = {}
    for index, (keyword, arguments) in enumerate(instructions):
        commands = arguments.split("&&") if keyword == "RUN" else []
        for words in (command.split() for command in commands):
            if words[:2] != ["apt-get", "install"]:
                continue
            for word in (word for word in words[2:] if not word.startswith("-")):
                package, _, version = word.partition("=")
                version = re.sub(r'^"\$\{(\w+)\}"$', lambda m: defaults[m.group(1)], version)
                versions[package] = version
                if package in UNPINNED:
                    assert instructions[index - 1] == ("#", "hadolint ignore=DL3008")
                else:
                    assert DEBIAN_VERSION.fullmatch(version), f"{package}={version}"
    assert set(versions) == {"gcc", "libc6-dev", "tini"}
    header = " ".join(text for keyword, text in instructions if keyword == "#")
    for package in UNPINNED:
        assert f"{package} is the exception" in header


def test_the_image_keeps_its_health_check() -> None:
    (check,) = [arguments for keyword, arguments in dockerfile() if keyword == "HEALTHCHECK"]
    assert "/healthz" in check


def dockerignore_pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker matches it: ``*`` and ``?`` within one path
    segment, ``**`` across any number of them."""
    regex, index = "", 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            regex, index = regex + "(?:.*/)?", index + 3
        elif pattern.startswith("**", index):
            regex, index = regex + ".*", index + 2
        elif pattern[index] == "*":
            regex, index = regex + "[^/]*", index + 1
        elif pattern[index] == "?":
            regex, index = regex + "[^/]", index + 1
        elif pattern[index] == "[":
            end = pattern.index("]", index)
            regex, index = regex + pattern[index : end + 1], end + 1
        else:
            regex, index = regex + re.escape(pattern[index]), index + 1
    return re.compile(regex)


def in_build_context(path: str) -> bool:
    """Whether .dockerignore lets PATH into the build context: the last pattern that
    matches it, or one of the folders it is in, decides; ``!`` lets in again."""
    parts = path.split("/")
    candidates = ["/".join(parts[: end + 1]) for end in range(len(parts))]
    included = True
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = dockerignore_pattern(line.removeprefix("!").strip("/"))
        if any(pattern.fullmatch(candidate) for candidate in candidates):
            included = negated
    return included


def test_everything_the_image_copies_is_in_its_build_context() -> None:
    sources = [
        source
        for keyword, arguments in dockerfile()
        if keyword == "COPY" and not arguments.startswith("--from")
        for source in arguments.split()[:-1]
    ]
    assert "deploy/config.redis.toml" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert in_build_context(source), f".dockerignore leaves out {source}, which COPY needs"


def test_secrets_and_local_state_stay_out_of_the_build_context() -> None:
    for path in ["deploy/.env", ".git/config", ".venv/bin/python", "tests/conftest.py"]:
        assert not in_build_context(path), path
    for path in ["gateway/__pycache__/app.cpython-313.pyc", "gateway/normalise/compiled.c"]:
        assert not in_build_context(path), path
    assert in_build_context("gateway/normalise/compiled.pyx")
