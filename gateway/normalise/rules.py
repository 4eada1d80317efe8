"""Which record canonicaliser runs: the compiled twin or the pure-Python reference.

The rules of the published schema are written once, in Python
(``gateway.normalise.schema.canonicalise_python`` and the coercions it calls); they are
the reference. ``gateway.normalise.compiled`` (Cython) applies the same rules faster and
is held to them by tests/normalise/test_compiled.py. It is optional: the build makes it when
a C compiler is at hand (setup.py), and without it everything runs in Python with the
same results.

This module is the one place that decides. The compiled canonicaliser runs when it was
built and imports, unless the environment variable ``RECORDS_GATEWAY_PURE_PYTHON`` is
true (``1``, ``true``, ``yes`` or ``on``) when this module is first imported; then the
Python rules run, which is how to rule the compiled module out when a result is in doubt.
:func:`engine_name` says which one runs, for the log at start; :func:`use_engine`
switches, for tests and measurements.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gateway.normalise import compiled
else:
    try:
        from gateway.normalise import compiled
    except ImportError:  # built without a C compiler: the Python rules run
        compiled = None

__all__ = [
    "ENVIRONMENT_VARIABLE",
    "Engine",
    "compiled",
    "compiled_available",
    "compiled_in_use",
    "engine_name",
    "use_engine",
]

Engine = Literal["compiled", "python"]

ENVIRONMENT_VARIABLE = "RECORDS_GATEWAY_PURE_PYTHON"
_TRUE = frozenset({"1", "true", "yes", "on"})


def compiled_available() -> bool:
    """Whether the compiled canonicaliser was built and imported."""
    return compiled is not None


def _from_environment() -> bool:
    pure = os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() in _TRUE
    return compiled_available() and not pure


_compiled_in_use = _from_environment()


def compiled_in_use() -> bool:
    """Whether the compiled canonicaliser is the one that runs (then ``compiled`` is
    the module); else the Python rules run, and nothing may touch ``compiled``."""
    return _compiled_in_use


def engine_name() -> Engine:
    """``"compiled"`` or ``"python"``: the canonicaliser that runs, to be logged once at
    start."""
    return "compiled" if _compiled_in_use else "python"


def use_engine(engine: Engine | None = None) -> Engine:
    """Run ``engine`` from now on, or with None what the environment says (as at
    import); returns the one now in use. RuntimeError for "compiled" when it was not
    built. Switch between answers, not while one is being normalised."""
    global _compiled_in_use
    if engine is None:
        _compiled_in_use = _from_environment()
    elif engine == "compiled":
        if not compiled_available():
            raise RuntimeError(
                "the compiled canonicaliser (gateway.normalise.compiled) was not built"
            )
        _compiled_in_use = True
    elif engine == "python":
        _compiled_in_use = False
    else:
        raise ValueError(f"unknown engine {engine!r}: 'compiled' or 'python'")
    return engine_name()
