"""cache.atomic, the one temp-file-then-rename writer: complete files only, the old file kept on
any failure, no temporary file left behind, a full disk as cache.integrity's one message."""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from cache.atomic import atomic_file, atomic_path, temp_files, temp_name
from cache.integrity import NoRoom


def leftovers(folder):
    return [p.name for p in folder.iterdir() if ".tmp-" in p.name]


def test_a_file_object_is_written_fsynced_and_renamed(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    path = tmp_path / "doc.json"
    with atomic_file(path, "w", encoding="utf-8") as fh:
        fh.write("{}\n")
        assert fh.name == str(temp_name(path)) and not path.exists()
    assert path.read_text() == "{}\n" and len(synced) == 1 and not leftovers(tmp_path)


def test_a_library_writes_the_temporary_path_with_its_suffix(tmp_path):
    path = tmp_path / "arrays.npz"
    with atomic_path(path, suffix=".npz") as tmp:
        assert tmp.name == f".arrays.npz.tmp-{os.getpid()}.npz"
        np.savez(tmp, a=np.arange(3))     # numpy keeps a name that ends in .npz
    assert np.load(path)["a"].tolist() == [0, 1, 2] and not leftovers(tmp_path)


@pytest.mark.parametrize("durable", [True, False])
def test_a_failed_write_keeps_the_old_file_and_no_temporary_one(tmp_path, durable):
    path = tmp_path / "table.csv"
    path.write_text("old\n")
    with pytest.raises(ValueError, match="half"):
        with atomic_path(path, durable=durable) as tmp:
            tmp.write_text("new, half")
            raise ValueError("half written")
    assert path.read_text() == "old\n" and not leftovers(tmp_path)


def test_no_room_is_the_one_disk_full_message_where_the_caller_says_what_is_kept(tmp_path):
    path = tmp_path / "best.pt"
    path.write_bytes(b"old")
    with pytest.raises(NoRoom, match=rf"disk full while writing {path}: free space, then re-run "
                                     r"the same command; the old one is kept \(no space left"):
        with atomic_file(path, kept="the old one is kept") as fh:
            fh.write(b"new")
            raise RuntimeError("torch.save failed") from OSError(errno.ENOSPC, "No space")
    assert path.read_bytes() == b"old" and not leftovers(tmp_path)
    # without ``kept`` the error is the writer's own, unchanged
    with pytest.raises(OSError) as err:
        with atomic_file(path) as fh:
            raise OSError(errno.ENOSPC, "No space")
    assert not isinstance(err.value, NoRoom) and not leftovers(tmp_path)


def test_the_temporary_files_of_a_path_are_found_whichever_process_left_them(tmp_path):
    path = tmp_path / "shard-00002.h5"
    left = [tmp_path / f".shard-00002.h5.tmp-{pid}" for pid in (7, 12)]
    for p in left + [tmp_path / ".shard-00003.h5.tmp-7"]:
        p.write_bytes(b"half")
    assert temp_files(path) == sorted(left)
