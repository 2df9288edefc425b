"""Datasets -> uint8 pixel rows, shared by extract, classifier and oracle.  Imports core, cache.
sources.py   which samples a split holds (samples.py), one Format per layout (folders.py: ImageFolder,
             ImageNet; idx.py; attacked.py; unlabelled.py: unlabelled files); listing.py: files,
             links, names; classes.py: output k = class k?; labels.py; newclass.py: subsets
images.py    decode -> corrupt -> resize/crop, in loader.py's batches and loader; orientation.py: EXIF
             (opt-in); stamps.py: file stamps and hashes; errors.py: DataError
decode.py    nvJPEG on the accelerator; resize.py, prefetch.py: batched resize, stages ahead of use;
             jpeg.py: which rows/files go to it; hwdecode.py: the NVJPG engines via nvImageCodec
corruptions.py  ImageNet-C's 19 corruptions; imagenet_c.py: names, parameters (torch-free);
             imagecorruptions_compat.py: the imagecorruptions package on numpy 2, seeded per call
"""
