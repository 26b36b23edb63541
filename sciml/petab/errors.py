"""The error of a bad PEtab problem (file, row, column in the message)."""

__all__ = ["PetabError"]


class PetabError(ValueError):
    """A PEtab problem that cannot be read: the message names the file, row and column."""
