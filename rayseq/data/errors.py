"""The data layer's error type, shared by the preparation and the readers of Hugging Face folders."""


class DataError(ValueError):
    """Bad input data, options or output directory; names the file and the 1-based line where it can."""
