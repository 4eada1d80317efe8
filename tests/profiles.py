"""Hypothesis profiles: ``ci`` runs every property test with its full example count
(CI sets CI=true; HYPOTHESIS_PROFILE=ci does the same anywhere), ``dev``, the default
for local runs, a fifth of it."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci")
settings.register_profile("dev", max_examples=20)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)


def examples(full: int) -> int:
    """How many examples a property test that asks for ``full`` runs in this profile."""
    return full if PROFILE == "ci" else max(10, full // 5)
