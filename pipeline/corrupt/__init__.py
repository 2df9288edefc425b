"""``cli.py corrupt``: write ImageNet-C-layout folders (``<corruption>/<severity>/<class>/...``)
from any split, for users without the ImageNet-C download.  Imports data, core.

run.py      the rows -> corrupted image files loop (loader workers write), manifest, resume
command.py  the click command
"""
