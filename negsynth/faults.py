"""Fault injection for the resume tests: ``NEGSYNTH_CRASH_AT=<name>`` SIGKILLs the process at the
:func:`crash_point` of that name (a shard being finalized, a checkpoint being saved), so a test can
kill a real run at an exact point and check that a rerun resumes. Unset, a crash point is a no-op."""

from __future__ import annotations

import os
import signal

_CRASH_AT = os.environ.get("NEGSYNTH_CRASH_AT") or None


def crash_point(name: str) -> None:
    if _CRASH_AT is not None and _CRASH_AT == name:
        os.kill(os.getpid(), signal.SIGKILL)
