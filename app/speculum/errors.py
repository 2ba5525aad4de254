"""The one error type a user can cause; its message is shown as-is in the CLI and window."""


class SpeculumError(Exception):
    """A problem the user can act on (bad file, wrong pair, full context, no disk space).

    The message is one plain sentence or two, never a traceback.
    """


class ContextFullError(SpeculumError):
    """The model's context window has no room for more tokens."""
