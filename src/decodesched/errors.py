"""Errors a user can fix: the CLI prints them as one line and exits 2."""


class UserError(ValueError):
    """Bad input (a file, an option, a value); the message says what and where."""
