"""The errors every data module raises for a user's data problem (printed without a traceback);
no torch here, so a caller can catch them without loading what raises them."""


class DataError(ValueError):
    """The data root, a split, a class folder or a labels file is missing or inconsistent."""


class BadImageError(RuntimeError):
    """An image file could not be decoded; the message names the file and its row index."""
