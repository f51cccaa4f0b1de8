"""Errors a user can fix: the CLI prints them as one line and exits 2."""


class UserError(ValueError):
    """Bad input (a file, an option, a value); the message says what and where."""


class OutputError(UserError, OSError):
    """An output that cannot be written (refused target, read-only file system, full disk, closed pipe).

    Both a `UserError` (one line, exit 2) and an `OSError`, so that code catching either sees it."""
