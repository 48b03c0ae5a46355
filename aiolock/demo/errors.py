"""The demo's one exception."""


class DemoError(Exception):
    """The demo could not run: Redis or the database unreachable, a worker process failed."""
