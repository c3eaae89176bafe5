"""User-facing errors: the CLI prints these as one line and exits non-zero."""


class RedwoodError(Exception):
    """A problem with the user's input or environment, with a message saying what to do."""
