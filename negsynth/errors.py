"""Errors negsynth raises on purpose: one line that names the file, the field and the fix. The CLI
prints :class:`NegsynthError` as one line on stderr and exits with its ``exit_code``.
"""


class NegsynthError(Exception):
    """Base of every error negsynth raises on purpose. ``exit_code``: the CLI's exit status."""

    exit_code = 2


class UserError(NegsynthError):
    """A mistake the user can fix (bad config, bad input, unreachable server). Exit code 2."""
