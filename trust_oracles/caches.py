"""A classifier cache (what ``cli.py extract`` wrote) as numpy arrays.

    cache = open_cache("artifacts/colours/cache/vit_tiny_patch16_224/val")
    cache.num_rows, cache.identity["model"]
    cache.logits                    # (N, K) float32, row i = the split's sample of global index i
    cache.correct[cache.valid].mean()       # the classifier's accuracy

A cache directory is ``<cache root>/<classifier>/<split tag>/`` (docs/DATA_CONTRACT.md).  Rows
are in global-index order: row i is the i-th sample of the split's sorted list of files.  Every
column is read through ``cache.reader.ClassifierCache``, which checks each shard's identity, row
range and per-column checksum, and is read once, on first access.  Rows an ``extract --skip-bad``
recorded as undecodable have ``valid`` False and zeros in every other column.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cache.manifest import MANIFEST_FILE
from cache.reader import ClassifierCache
from cache.schema import FEATURE_COLUMN, CacheError, check_identity
from pipeline.data.newclass import CLASSES_KEPT, select_classes
from pipeline.data.sources import SampleList, is_embedded, list_split
from pipeline.oracle.settings.targets import check_classifier, check_images
from trust_oracles.errors import MissingDependencyError

if TYPE_CHECKING:
    import pandas


@dataclass(frozen=True, eq=False)
class Cache:
    """A complete classifier cache: its identity, and its columns as arrays read on access.

    Attributes
    ----------
    path : Path
        The cache directory, ``<cache root>/<classifier>/<split tag>``.
    identity : dict
        What the cache is (docs/DATA_CONTRACT.md): ``model``, ``model_kwargs``,
        ``weights_sha256``, ``data_config``, ``dataset``, ``dataset_fingerprint``, ``split``,
        ``corruption``, ``num_rows``, ``num_classes``, ``precision``, ``features``, ...
    num_rows : int
        N, the number of samples of the split (valid or not).
    classifier : str
        The ``--classifier`` name it was extracted with (the directory name under the root).
    columns : tuple of str
        The columns it holds (``features`` only where extracted with ``--features``).
    """

    path: Path
    identity: dict = field(repr=False)
    num_rows: int
    classifier: str
    columns: tuple[str, ...]
    _reader: ClassifierCache = field(repr=False)

    def _column(self, name: str) -> np.ndarray:
        return self._reader.load([name])[name]

    @cached_property
    def logits(self) -> np.ndarray:
        """(N, K) float32: the classifier's logits (stored as float16)."""
        return self._column("logits").astype(np.float32)

    @cached_property
    def pred(self) -> np.ndarray:
        """(N,) int64: the predicted class, the argmax of the unrounded logits."""
        return self._column("pred")

    @cached_property
    def label(self) -> np.ndarray:
        """(N,) int64: the true class, in the dataset's class order."""
        return self._column("label")

    @cached_property
    def correct(self) -> np.ndarray:
        """(N,) bool: ``pred == label``, the trust label an oracle learns."""
        return self._column("correct").astype(bool)

    @cached_property
    def valid(self) -> np.ndarray:
        """(N,) bool: False for an image ``extract --skip-bad`` could not decode."""
        return self._column("valid").astype(bool)

    @cached_property
    def msp(self) -> np.ndarray:
        """(N,) float32: the maximum softmax probability, from the unrounded logits."""
        return self._column("p_max")

    @cached_property
    def features(self) -> np.ndarray:
        """(N, D) float32: the pooled pre-logit features (stored as float16).

        Raises
        ------
        CacheError
            The cache was extracted without ``--features``.
        """
        if FEATURE_COLUMN not in self.columns:
            raise CacheError(
                f"cache {self.path} holds no features (extracted without --features). Extract "
                f"them with the same `cli.py extract` command plus --features, into another "
                f"--out (this cache's identity records features: false, so extracting into it "
                f"again is refused)")
        return self._column(FEATURE_COLUMN).astype(np.float32)

    @cached_property
    def paths(self) -> np.ndarray | None:
        """(N,) object array of str: each row's image file, or None for idx arrays (the
        embedded Fashion-MNIST), whose rows are no files.

        The split is listed again from the ``--data`` root the cache was extracted from and
        checked as ``train-oracle`` checks it: the same files and labels (the dataset
        fingerprint), each file still the one the logits were computed from.  A corrupted split
        (``identity["corruption"]``) names the clean files the corruption was applied to.

        Raises
        ------
        DataError
            The data root is gone or no longer lists this split.
        CacheError
            The listed files or labels are not the cache's, or images changed since
            extraction (the fix: re-run the same ``cli.py extract`` command).
        """
        config = self._reader.manifest.get("config", {})
        if is_embedded(config.get("data")):
            return None
        samples = self._samples(config)
        if samples.idx_images is not None:
            return None
        return np.array([str(samples.path(i)) for i in range(len(samples))], dtype=object)

    def _samples(self, config: dict) -> SampleList:
        """The split listed from the cache's data root, checked against the cache."""
        data, split = config.get("data"), self.identity["split"]
        samples = select_classes(list_split(data, split, config.get("labels_file")),
                                 self.identity.get(CLASSES_KEPT))   # data/newclass.py
        check_identity(self.identity, {"dataset": samples.dataset,
                                       "dataset_fingerprint": samples.fingerprint,
                                       "num_rows": len(samples)}, f"cache {self.path}",
                       hint=f"The split {split!r} listed from {data} (the --data it was "
                            "extracted from) is not the one this cache was extracted from: its "
                            "files or labels changed; re-run the same `cli.py extract` command")
        check_images(self._reader, samples)
        return samples

    def to_frame(self, paths: bool = True) -> "pandas.DataFrame":
        """One row per cached row: ``index``, ``path``, ``label``, ``pred``, ``correct``,
        ``msp``, ``valid``.

        Parameters
        ----------
        paths : bool, default True
            Fill ``path`` from ``Cache.paths`` (None for idx rows); False leaves it out, for a
            cache whose data root is not at hand.

        Returns
        -------
        pandas.DataFrame
            N rows, ordered by global index.

        Raises
        ------
        MissingDependencyError
            pandas is not installed.
        """
        try:
            import pandas as pd
        except ImportError:
            raise MissingDependencyError("Cache.to_frame needs pandas, which is not installed: "
                                         "pip install pandas") from None
        columns = {"index": np.arange(self.num_rows, dtype=np.int64)}
        if paths:
            found = self.paths
            columns["path"] = found if found is not None else np.full(self.num_rows, None)
        columns.update(label=self.label, pred=self.pred, correct=self.correct, msp=self.msp,
                       valid=self.valid)
        return pd.DataFrame(columns)


def open_cache(path: str | Path, *, classifier: str | None = None) -> Cache:
    """Open a complete classifier cache, checked as every stage checks it.

    Parameters
    ----------
    path : str or Path
        The cache directory ``<cache root>/<classifier>/<split tag>``, e.g.
        ``artifacts/fashion-mnist/cache/vit/test``.
    classifier : str, optional
        The ``--classifier`` name it must have been extracted with; a cache copied or moved under
        another classifier's name is refused as ``train-oracle`` refuses it.  None: not checked.

    Returns
    -------
    Cache

    Raises
    ------
    CacheError
        No complete cache there (a cache root is answered with the caches it holds), a shard
        is missing or damaged, or it was extracted under another ``classifier`` name.
    """
    path = Path(path).expanduser()
    if not (path / MANIFEST_FILE).exists():
        _refuse_cache_root(path)
    reader = ClassifierCache.open(path)
    if classifier is not None:
        check_classifier(reader, classifier)
    config = reader.manifest.get("config", {})
    return Cache(path=path, identity=dict(reader.identity), num_rows=reader.num_rows,
                 classifier=config.get("classifier") or path.resolve().parent.name,
                 columns=tuple(reader.manifest["columns"]), _reader=reader)


def _refuse_cache_root(path: Path) -> None:
    """A cache root (or a classifier's folder) passed for a cache: name the caches inside."""
    inside = sorted(str(m.parent) for pattern in ("*/*/" + MANIFEST_FILE, "*/" + MANIFEST_FILE)
                    for m in path.glob(pattern)) if path.is_dir() else []
    if inside:
        raise CacheError(f"{path} is not a cache but holds {len(inside)}: pass one of them, "
                         f"<cache root>/<classifier>/<split tag>, e.g. {', '.join(inside[:3])}")
