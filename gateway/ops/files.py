"""Files that the workers of one instance share (each worker's metrics and shadow
counts in the shared metrics folder): written whole, so that a reader in another
process never sees one half-written."""

from __future__ import annotations

import os
from pathlib import Path


def write_whole(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one step: written beside it under a name of this
    process's own, then renamed over it (a rename within a folder is atomic)."""
    aside = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        aside.write_bytes(data)
        os.replace(aside, path)
    except BaseException:
        aside.unlink(missing_ok=True)
        raise
