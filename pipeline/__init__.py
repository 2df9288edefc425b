"""The pipeline, one package per stage; imports flow one way (tests/test_layout.py enforces it):

    core  <-  data  <-  extract, classifier, oracle        report <- core (torch-free parts)
    demo runs the stages as ``cli.py`` subprocesses; ``cache`` (beside this package) is the
    versioned on-disk contract between them.

core: models, precision, DDP, presets, metrics.  data: datasets -> uint8 pixel rows.
extract (stage 1): classifier -> cache.  classifier: fits the embedded base classifiers.
oracle (stage 2): cache -> trained oracle + outputs.  report (stage 3): outputs -> tables, figures.
"""
