"""User-facing errors: the CLI prints them as one line and exits non-zero, without a traceback."""


class UserError(Exception):
    """Something the user can fix: a bad config key, a missing file, a corrupt checkpoint."""
