"""A full disk during `extract` or `train-oracle`: one clear message naming the
file, exit code 1, nothing complete lost, and the same command finishes the work afterwards.

Real write failures, not mocks: the command runs in a child process whose file size limit
(RLIMIT_FSIZE, works unprivileged and as root) is below the size of the file being written, so
the kernel fails the write with EFBIG exactly where a full disk fails it with ENOSPC.  Where a
user namespace can mount a small tmpfs (`unshare -rm`), the real ENOSPC is tested too.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys

import h5py
import pytest

from conftest import ROOT, TINY_VIT, make_imagenet_tree
from oracle_fixtures import extract as extract_cli
from oracle_fixtures import run_cli, train_args, write_colour_tree
from pipeline.data.labels import imagenet_synsets

TINY = ["--classifier", TINY_VIT[0], "--model-kwargs", json.dumps(TINY_VIT[1]), "--random-init",
        "--device", "cpu", "--precision", "fp32", "--workers", "0", "--batch-size", "4",
        "--shard-size", "6", "--no-progress"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def file_size_limit(limit: int):
    def apply():  # in the child, before exec (Python itself ignores SIGXFSZ: writes get EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def cli_command(*args) -> list[str]:
    return [sys.executable, str(ROOT / "cli.py"), *map(str, args)]


def assert_clean_failure(proc, pattern: str) -> None:
    import re

    assert proc.returncode == 1, proc.stderr[-3000:]
    assert re.search(pattern, proc.stderr), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "RuntimeError" not in proc.stderr, proc.stderr[-3000:]


def temporaries(directory) -> list[str]:
    return [p.name for p in directory.rglob("*") if ".tmp-" in p.name]


@pytest.fixture
def tree(tmp_path):
    return make_imagenet_tree(tmp_path / "inet", list(imagenet_synsets()[:3]), per_class=5,
                              splits=("val",))


def test_extract_past_the_file_size_limit(tree, tmp_path):
    """Before: h5py's RuntimeError traceback (the writer handled OSError only)."""
    out = tmp_path / "c"
    cmd = cli_command("extract", *TINY, "--data", tree, "--split", "val", "--out", out)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300,
                          preexec_fn=file_size_limit(16_000))   # a 6-row shard is ~22 KB
    cache = out / TINY_VIT[0] / "val"
    assert_clean_failure(proc, r"error: disk full while writing \S*shard-00000.h5: free space, "
                               r"then re-run the same command; completed shards are kept .*"
                               r"\(file size limit reached\)")
    # nothing was written, so the failed start also gives its claim back (no cache folder left)
    assert not cache.exists() and not any(out.rglob("*.tmp*"))
    again = run_cli(["extract", *TINY, "--data", tree, "--split", "val", "--out", out])
    assert "15 rows in" in again.output


def _can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="no user namespace to mount a small tmpfs in")
def test_extract_onto_a_full_tmpfs_keeps_the_complete_shards(tree, tmp_path):
    """The issue's case: ~150 lines of h5py tracebacks, then a segfault (exit 139).  A 48 KiB
    tmpfs holds identity.json and the first 22 KB shard, not the second."""
    mnt, copy = tmp_path / "mnt", tmp_path / "copy"
    mnt.mkdir()
    cmd = " ".join(cli_command("extract", *[f"'{a}'" for a in TINY], "--data", tree, "--split",
                               "val", "--out", mnt / "c"))
    script = (f"mount -t tmpfs -o size=48k tmpfs {mnt} && {{ {cmd}; echo rc=$? >&2; }}; "
              f"cp -a {mnt / 'c'} {copy}")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                          env=ENV, timeout=300)
    assert "rc=1" in proc.stderr, proc.stderr[-3000:]
    proc.returncode = 1
    assert_clean_failure(proc, r"error: disk full while writing \S*shard-00001.h5: free space, "
                               r"then re-run the same command; completed shards are kept .*"
                               r"\(no space left on the device\)")
    cache = copy / TINY_VIT[0] / "val"
    assert sorted(p.name for p in cache.iterdir()) == ["identity.json", "shard-00000.h5"]
    again = run_cli(["extract", *TINY, "--data", tree, "--split", "val", "--out", copy])
    assert "9 rows in" in again.output      # only the missing shards


def test_train_oracle_past_the_file_size_limit(tmp_path):
    """Before: a raw traceback from torch.save, and run.json left at status 'running'.  Then
    (item 5) damaged oracle outputs are recomputed by the same command."""
    data = write_colour_tree(tmp_path / "colours", {"train": 8, "val": 4})
    cache, run = tmp_path / "cache", tmp_path / "run"
    extract_cli(data, cache)
    args = train_args(data, cache, run, "--epochs", 1, "--ckpt-every", 1, "--val-fraction", 0)
    proc = subprocess.run(cli_command(*args), capture_output=True, text=True, env=ENV,
                          timeout=300, preexec_fn=file_size_limit(100_000))  # checkpoint ~0.5 MB
    assert_clean_failure(proc, r"error: disk full while writing \S*checkpoints/last.pt: free "
                               r"space, then re-run the same command; the previous last.pt is "
                               r"kept and the run resumes from it \(file size limit reached\)")
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "failed" and "disk full" in record["error"]
    assert not temporaries(run)
    done = run_cli(args)
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "complete", done.output
    # item 5 on the same run: run.json records each output file's size and XXH3-128 hash; a damaged
    # output file is recomputed by the same command from the kept oracle, to the same bytes
    from cache.integrity import file_digest
    output = run / "outputs" / "val.h5"
    assert record["output_files"] == {"val": file_digest(output)}
    with h5py.File(output, "r") as fh:
        offset = fh["z"].id.get_offset()
    data = bytearray(output.read_bytes())
    data[offset + 2] ^= 0x01
    output.write_bytes(bytes(data))
    again = run_cli(args)
    assert "outputs already written" not in again.output
    assert json.loads((run / "run.json").read_text())["output_files"] == record["output_files"]
