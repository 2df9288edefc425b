"""Datasets -> uint8 pixel rows, shared by extract, classifier and oracle.  Imports core, cache.

sources.py      which samples a split holds (ImageNet layouts, ImageFolder, Fashion-MNIST), labels;
                classes.py: does a classifier's output k mean the dataset's class k
labels.py       label files of flat validation folders; errors.py: DataError (no traceback)
images.py       decode -> corrupt -> resize/crop in loader workers; normalisation on the device
decode.py       nvJPEG decoding on the accelerator (extract --decode gpu|mixed)
resize.py, prefetch.py  batched resize + crop of mixed sizes; background stages ahead of use
corruptions.py  ImageNet-C's 19 corruptions; imagenet_c.py: names, parameters (torch-free);
imagecorruptions_compat.py: the imagecorruptions package on numpy 2, seeded per call
"""
