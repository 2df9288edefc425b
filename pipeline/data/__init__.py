"""Datasets -> uint8 pixel rows, shared by extract, classifier and oracle.  Imports core, cache.

sources.py   which samples a split holds: one Format per layout (ImageFolder/ImageNet, Fashion-MNIST
             idx.py files, attacked.py's splits); classes.py: does output k mean class k
labels.py    label files of flat validation folders; errors.py: DataError (no traceback)
images.py    decode -> corrupt -> resize/crop in loader workers; normalisation on the device
decode.py    nvJPEG on the accelerator; resize.py, prefetch.py: batched resize, stages ahead of use;
             jpeg.py: which rows/files go to it; hwdecode.py: the NVJPG engines via nvImageCodec
corruptions.py  ImageNet-C's 19 corruptions; imagenet_c.py: names, parameters (torch-free);
             imagecorruptions_compat.py: the imagecorruptions package on numpy 2, seeded per call
"""
