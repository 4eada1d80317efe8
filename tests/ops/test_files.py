"""write_whole: a shared file is replaced in one step, and nothing is left beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.ops.files import write_whole


def test_a_file_is_replaced_whole_and_nothing_is_left_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "gateway_histograms_1.json"
    target.write_bytes(b'{"old": true}')
    write_whole(target, b'{"new": true}')
    assert target.read_bytes() == b'{"new": true}'
    assert [path.name for path in tmp_path.iterdir()] == [target.name]


def test_a_replace_that_fails_leaves_the_old_file_and_no_stray(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()  # a folder: the rename over it fails
    (target / "inside").write_bytes(b"kept")
    with pytest.raises(IsADirectoryError):
        write_whole(target, b"data")
    assert [path.name for path in tmp_path.iterdir()] == ["taken"]
    assert (target / "inside").read_bytes() == b"kept"
