"""The error every data module raises for a user's data problem (printed without a traceback)."""


class DataError(ValueError):
    """The data root, a split, a class folder or a labels file is missing or inconsistent."""
