"""User-facing errors: one line that names the file, the field and the fix. No traceback."""


class UserError(Exception):
    """A mistake the user can fix (bad config, bad input, unreachable server). Exit code 2."""


class BudgetExceeded(Exception):
    """Raised inside a stage when a --max-* budget stops it; finished work is kept."""
