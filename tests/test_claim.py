"""Claiming an output folder (cache/claim.py), the one way every stage does it: a new folder gets
its record first, the same identity is resumed or found complete, another identity is refused
naming the folder, each differing attribute with both values and the fix, a foreign folder is
refused.  Against the real files each stage writes (identity.json, run.json, .attack/claim.json,
corrupt's manifest.json), no mocks."""
from __future__ import annotations

import json
import re

import pytest

from cache import manifest as mf
from cache.atomic import write_json_atomic
from cache.claim import Claim
from cache.schema import SCHEMA_VERSION, CacheError, CacheMismatch, canonical, identity_diff

IDENT = {"schema_version": SCHEMA_VERSION, "kind": "classifier", "model": "m",
         "model_kwargs": {"depth": (1, 2)}, "num_rows": 6, "split": "val"}
RULE = Claim(record="meta/claim.json", marker="meta/done.json", error=CacheError,
             refused="{folder} holds another thing", fix="Use another --out.",
             foreign="{folder} holds no {record}; choose another --out")


def refusal(excinfo) -> str:
    return str(excinfo.value)


# ---------------------------------------------------------------------------- the shared claim --
def test_a_new_folder_gets_its_record_first_in_the_json_record_format(tmp_path):
    folder = tmp_path / "a" / "b"
    assert RULE.take(folder, IDENT) == "new"
    record = folder / "meta" / "claim.json"
    assert record.read_bytes() == (json.dumps(canonical(IDENT), indent=2, sort_keys=True)
                                   + "\n").encode()
    assert RULE.found(folder) == canonical(IDENT)
    assert RULE.found(tmp_path / "nothing") is None


def test_the_same_identity_resumes_then_is_complete_once_its_marker_exists(tmp_path):
    RULE.take(tmp_path, IDENT)
    before = (tmp_path / "meta" / "claim.json").stat().st_mtime_ns
    # tuples and lists, key order: the same identity
    assert RULE.take(tmp_path, {**dict(reversed(IDENT.items())),
                                "model_kwargs": {"depth": [1, 2]}}) == "resume"
    (tmp_path / "meta" / "done.json").write_text("{}")
    assert RULE.take(tmp_path, IDENT) == "complete"
    assert (tmp_path / "meta" / "claim.json").stat().st_mtime_ns == before   # never rewritten


def test_another_identity_is_refused_naming_the_folder_each_attribute_both_values_and_the_fix(
        tmp_path):
    RULE.take(tmp_path, IDENT)
    with pytest.raises(CacheError) as err:
        RULE.take(tmp_path, {**IDENT, "model": "other", "model_kwargs": {"depth": [1, 3]},
                             "extra": True})
    text = refusal(err)
    assert text.startswith(f"{tmp_path} holds another thing:\n")
    assert text.splitlines()[1:] == [
        "  extra: the folder has None, this command True",
        "  model: the folder has 'm', this command 'other'",
        "  model_kwargs.depth: the folder has [1, 2], this command [1, 3]",
        "Use another --out."]
    assert RULE.found(tmp_path) == canonical(IDENT)                        # untouched


def test_a_foreign_folder_is_refused_or_taken_and_hidden_names_do_not_count(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CacheError, match=re.escape(f"{tmp_path} holds no meta/claim.json")):
        RULE.take(tmp_path, IDENT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    taken = Claim(record="claim.json", refused="x", fix="y")              # foreign=None
    assert taken.take(tmp_path, IDENT) == "new" and (tmp_path / "claim.json").exists()
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / ".lock").write_text("{}")
    assert RULE.take(hidden, IDENT) == "new"


def test_a_record_written_later_a_completion_read_from_it_and_more_lines_for_a_refusal(tmp_path):
    rule = Claim(record="run.json", section="run", write=None, keys=("seed",), found_in="run",
                 expected_in="expected", nested=False, show=None,
                 finished=lambda record: record.get("status") == "complete",
                 explain=lambda found, new: [f"was seed {found['seed']}"],
                 refused="{folder} holds another run", fix="")
    assert rule.take(tmp_path, {"seed": 1}) == "new" and not any(tmp_path.iterdir())
    write_json_atomic(tmp_path / "run.json", {"run": {"seed": 1}, "status": "running"})
    assert rule.take(tmp_path, {"seed": 1}) == "resume"
    write_json_atomic(tmp_path / "run.json", {"run": {"seed": 1}, "status": "complete"})
    assert rule.take(tmp_path, {"seed": 1}) == "complete"
    with pytest.raises(CacheError) as err:
        rule.take(tmp_path, {"seed": 2})
    assert refusal(err) == (f"{tmp_path} holds another run:\n  seed: run has 1, expected 2\n"
                            "  was seed 1")


def test_a_damaged_record_is_one_clear_error(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "claim.json").write_text('{"model": ')
    with pytest.raises(CacheError, match=r"identity record .*claim\.json is unreadable"):
        RULE.take(tmp_path, IDENT)


def test_identity_diff_nested_and_in_the_callers_words():
    found = {"a": 1, "p": {"eps": 0.5, "steps": 3}}
    new = {"a": 1, "p": {"eps": 0.25, "alpha": 2, "steps": 3}}
    assert identity_diff(found, new) == ['p: cache has {"eps": 0.5, "steps": 3}, expected '
                                         '{"alpha": 2, "eps": 0.25, "steps": 3}']
    assert identity_diff(found, new, nested=True, found_in="the folder",
                         expected_in="this command", show=repr) == [
        "p.alpha: the folder has None, this command 2",
        "p.eps: the folder has 0.5, this command 0.25"]
    assert identity_diff(found, new, keys=("a",)) == []


# ------------------------------------------------------------------ extract: the cache's rule --
def test_the_cache_directory_claim(tmp_path):
    d = tmp_path / "cache" / "vit" / "val"
    assert mf.claim_directory(d, IDENT) is False
    assert (d / mf.IDENTITY_FILE).read_text() == json.dumps(canonical(IDENT), indent=2,
                                                            sort_keys=True) + "\n"
    assert mf.claim_directory(d, IDENT) is False                           # resume
    (d / mf.MANIFEST_FILE).write_text("{}")
    assert mf.claim_directory(d, IDENT) is True                            # complete
    with pytest.raises(CacheMismatch) as err:
        mf.claim_directory(d, {**IDENT, "model": "o", "num_rows": 7})
    assert refusal(err).splitlines()[:3] == [
        f"cache directory {d} holds a different cache:",
        '  model: cache has "m", expected "o"', "  num_rows: cache has 6, expected 7"]
    assert "pass the --data, --weights FILE" in refusal(err).splitlines()[3]
    (d / mf.IDENTITY_FILE).write_text(json.dumps({**IDENT, "schema_version": 0}))
    with pytest.raises(CacheMismatch, match=rf"cache directory {re.escape(str(d))} was written "
                                            r"with cache schema version 0"):
        mf.claim_directory(d, IDENT)


# ----------------------------------------------------------------- train-oracle: run.json's rule --
RECORD = {"oracle": "vit", "oracle_model": "vit", "classifier": "c", "loss": "ss", "variant": "",
          "loss_label": "SS", "seed": 0, "group": "g1", "dataset": "d", "num_classes": 3,
          "config": {"lr": 0.1, "weights_sha256": "aa"}}


def test_the_run_directory_claim(tmp_path):
    from cache.runs import LAST, RunDir, RunError

    run = RunDir(tmp_path / "run")
    assert run.claim(RECORD, False, ("lr",)) == "new" and not run.path.exists()  # run.json later
    with pytest.raises(RunError, match="--resume: .* has no checkpoint to resume from"):
        run.claim(RECORD, True, ("lr",))
    run.write(RECORD, "running", {"torch": "x"})
    assert run.claim(RECORD, False, ("lr",)) == "new"                 # no checkpoint yet
    run.checkpoint(LAST).parent.mkdir()
    run.checkpoint(LAST).write_bytes(b"x")
    assert run.claim(RECORD, True, ("lr",)) == "resume"
    run.write(RECORD, "complete", {"torch": "x"})
    assert run.claim(RECORD, False, ("lr",)) == "complete"
    other = {**RECORD, "group": "g2", "config": {"lr": 0.2, "weights_sha256": "bb"}}
    with pytest.raises(RunError) as err:
        run.claim(other, False, ("lr", "weights_sha256"), {"weights_sha256": "restore the file"})
    assert refusal(err).splitlines() == [
        f"run directory {run.path} holds another run:", '  group: run has "g1", expected "g2"',
        "  lr: run has 0.1, expected 0.2", '  weights_sha256: run has "aa", expected "bb"',
        "  restore the file", "Use another --out, or delete that directory to start over."]
    assert json.loads(run.run_file.read_text())["status"] == "complete"   # untouched
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    with pytest.raises(RunError, match=r"--out .*mine is not empty and is not a run directory "
                                       r"\(no run\.json\)"):
        RunDir(tmp_path / "mine").claim(RECORD, False, ())


# ------------------------------------------------------------- attack: .attack/claim.json's rule --
ATTACK = {"format": "trust-oracles-adversarial-split", "format_version": 1, "attack": "pgd_linf",
          "params": {"eps": 0.125, "steps": 3}, "seed": 0,
          "classifier": {"name": "c", "model_kwargs": {}}}


def test_the_adversarial_split_claim(tmp_path):
    from pipeline.attack import store
    from pipeline.attack.methods import AttackError

    split = tmp_path / "adv" / "val-adv"
    assert store.claim(split, ATTACK) is False
    assert (split / ".attack" / "claim.json").read_text() == json.dumps(
        ATTACK, indent=2, sort_keys=True) + "\n"
    assert store.claim(split, ATTACK) is False                             # resume
    (split / ".attack" / "manifest.json").write_text("{}")
    assert store.claim(split, ATTACK) is True                              # complete
    with pytest.raises(AttackError) as err:
        store.claim(split, {**ATTACK, "attack": "pgd_l2", "params": {"eps": 0.03, "steps": 3},
                            "classifier": {"name": "c", "model_kwargs": {"depth": 1}}})
    assert refusal(err).splitlines() == [
        f"{split} holds an adversarial split written by another attack run:",
        "  attack: the folder has 'pgd_linf', this command 'pgd_l2'",
        "  classifier.model_kwargs.depth: the folder has None, this command 1",
        "  params.eps: the folder has 0.125, this command 0.03",
        "Choose another --out-split or --out, or delete the folder to rebuild it."]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "x.png").write_bytes(b"")
    with pytest.raises(AttackError, match=r"mine exists and was not written by `cli.py attack` "
                                          r"\(no \.attack/claim\.json\)"):
        store.claim(tmp_path / "mine", ATTACK)


# --------------------------------------------------------------- corrupt: manifest.json's rule --
CORRUPT = {"format_version": 1, "writer": "cli.py corrupt",
           "source": {"dataset": "d", "split": "test", "rows": 12, "fingerprint": "ff"},
           "protocol": "native", "format": "png", "seed": 3, "jpeg_quality": None,
           "imagecorruptions": "1.1"}


def test_the_corrupted_folder_claim(tmp_path):
    from pipeline.corrupt.run import CLAIM
    from pipeline.data.errors import DataError

    out = tmp_path / "c"
    assert CLAIM.take(out, CORRUPT) == "new"
    assert (out / "manifest.json").read_text() == json.dumps(CORRUPT, indent=2)  # as it was
    assert CLAIM.take(out, CORRUPT) == "resume"             # files are skipped one by one
    with pytest.raises(DataError) as err:
        CLAIM.take(out, {**CORRUPT, "seed": 4, "source": {**CORRUPT["source"], "rows": 10}})
    assert refusal(err).splitlines() == [
        f"{out} was written by another corruption run:",
        "  seed: the folder has 3, this command 4",
        "  source.rows: the folder has 12, this command 10",
        "Use another --out, or delete the folder to write it again."]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "gaussian_noise").mkdir()                # a folder without a manifest:
    assert CLAIM.take(tmp_path / "d", CORRUPT) == "new"        # taken, as before the shared claim
