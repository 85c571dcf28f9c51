"""``read_bounded``: a small file read whole, or the reader's own error."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpud.files import read_bounded


class ReaderError(ValueError):
    pass


def test_reads_a_file_up_to_its_limit(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 8)
    assert read_bounded(f, f"a file {f}", limit=8, error=ReaderError) == b"x" * 8


def test_a_larger_file_raises_the_readers_error(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 9)
    with pytest.raises(ReaderError, match=r"^a file .* is larger than 8 bytes$"):
        read_bounded(f, f"a file {f}", limit=8, error=ReaderError)


def test_an_unreadable_file_names_itself_and_why(tmp_path: Path) -> None:
    with pytest.raises(ReaderError, match=r"^cannot read a file .*missing: No such file"):
        read_bounded(tmp_path / "missing", f"a file {tmp_path / 'missing'}", limit=8,
                     error=ReaderError)
    with pytest.raises(ReaderError, match="cannot read a directory"):
        read_bounded(tmp_path, "a directory", limit=8, error=ReaderError)
