"""Does a classifier's output k mean class k of the dataset?  Checked before a cache is claimed.

Class order (``pipeline.data.sources``): ``ROOT/classes.txt`` when present (one class per line,
in the order of the classifier's outputs); else ImageNet's 1000 synsets in timm's order when every
class folder is an ImageNet wnid; else the sorted folder names of ``train/`` (torchvision
ImageFolder's order, which a classifier fine-tuned with it follows).
"""
from __future__ import annotations

from pathlib import Path

from pipeline.data.errors import DataError
from pipeline.data.folders import empty_class_folders
from pipeline.data.sources import SampleList, is_embedded_dataset

FIX = ("list the classifier's classes in {path}, one per line in the order of its outputs (a "
       "classifier fine-tuned with torchvision's ImageFolder: the sorted folder names)")


def check_num_classes(num_classes: int, samples: SampleList, classifier: str) -> list[str]:
    """Refuse a classifier whose number of outputs does not match the dataset's classes (its
    trust labels would be noise); returns notes for the one accepted mismatch: K < 1000 outputs
    on ImageNet wnid folders, read as ImageNet's first K classes, when every label is below K."""
    n, top = len(samples.classes), int(samples.labels.max()) if len(samples) else -1
    if num_classes == n:
        return []
    fix = FIX.format(path=Path(samples.root) / "classes.txt")
    where = f"split {samples.split!r} of {samples.root}"
    if samples.dataset == "imagenet":
        if top < num_classes:
            return [f"--classifier {classifier} has {num_classes} outputs; the class folders are "
                    f"ImageNet wnids, so output k is read as ImageNet's class k (ImageNet's first "
                    f"{num_classes} classes: {_preview(samples.classes[:num_classes])}). If the "
                    f"classifier has other classes or another order, {fix}"]
        raise DataError(f"--classifier {classifier} has {num_classes} outputs but {where} has "
                        f"labels up to {top} in ImageNet's class order (its class folders are "
                        f"ImageNet wnids, so labels are indices among the 1000 synsets); if the "
                        f"classifier was trained on these folders, {fix}")
    empty = empty_class_folders(samples)
    hint = (f" Class folder(s) {', '.join(map(str, empty[:5]))} hold no images: remove "
            f"{'it' if len(empty) == 1 else 'them'} if {'it is' if len(empty) == 1 else 'they are'}"
            " not a class of the classifier." if empty else "")
    if is_embedded_dataset(samples.dataset):  # most often: --data forgotten, the default listed
        hint += (f" {samples.root} is Fashion-MNIST, the dataset used when no --data is given: "
                 "for your own images pass --data ROOT.")
    raise DataError(f"--classifier {classifier} has {num_classes} outputs but {where} has {n} "
                    f"classes ({_preview(samples.classes)}): its output k must mean class k.{hint} "
                    f"Use a classifier of these classes (--weights FILE: a weights file with a "
                    f"{n}-class head), or {fix}")


def _preview(classes, limit: int = 5) -> str:
    shown = ", ".join(classes[:limit])
    return shown + (f", ... {len(classes)} in all" if len(classes) > limit else "")
