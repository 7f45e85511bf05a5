"""Errors negsynth raises on purpose: one line that names the file, the field and the fix.

Every one derives from :class:`NegsynthError`, whose ``exit_code`` the CLI uses (one place turns
them into one line on stderr and that exit status, never a traceback). Library users catch
``NegsynthError`` for all of them; the specific classes keep their stdlib bases
(``ValueError``, ``RuntimeError``) so existing ``except ValueError`` code still works.
"""


class NegsynthError(Exception):
    """Base of every error negsynth raises on purpose. ``exit_code``: the CLI's exit status."""

    exit_code = 2


class UserError(NegsynthError):
    """A mistake the user can fix (bad config, bad input, unreachable server). Exit code 2."""


class BudgetExceeded(NegsynthError):
    """Raised inside a stage when a --max-* budget stops it; finished work is kept. Exit code 3."""

    exit_code = 3
