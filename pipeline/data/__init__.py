"""Datasets -> uint8 pixel rows, shared by extract, classifier and oracle.  Imports core, cache.

sources.py      which samples a split holds (ImageNet layouts, ImageFolder, Fashion-MNIST), labels
labels.py       label files of flat validation folders (devkit, Kaggle csv, "filename label")
errors.py       DataError (no traceback); attacked.py: the format of an `attack`-written split
images.py       decode -> corrupt -> resize/crop in loader workers; normalisation on the device
decode.py       nvJPEG decoding on the accelerator (extract --decode gpu|mixed)
resize.py       batched resize + crop of differently sized images
prefetch.py     a chain of background stages a few batches ahead of each other
corruptions.py  ImageNet-C-style corruptions; imagenet_c.py: their names and parameters (torch-free)
"""
