"""Errors a simulator raises for bad user input (unknown env id, missing extra, bad option)."""


class SimError(ValueError):
    """A one-line, user-facing problem with how an environment was asked for."""
