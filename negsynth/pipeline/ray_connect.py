"""Ray itself: imported with the install hint, connected to the cluster ``--ray-address`` names, and
a worker's negsynth error raised in the driver as itself."""

from __future__ import annotations

import os

from negsynth.errors import NegsynthError, UserError


def import_ray():
    """The ``ray`` module; without it, one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray: pip install 'negsynth[ray]' (or pip install ray)") from None
    return ray


def connect(address: str | None):
    """Ray, initialised (``address``, else ``$RAY_ADDRESS``, else a new local node)."""
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(address=ray_address(address), include_dashboard=False, log_to_driver=False, configure_logging=False)
    return ray


def ray_address(address: str | None) -> str:
    """``address``, else ``$RAY_ADDRESS``, else ``"local"``: a new local node (Ray's default would join
    whichever cluster this machine started last)."""
    return address or os.environ.get("RAY_ADDRESS") or "local"


def raise_cause(e: Exception):
    """Raise a worker's negsynth error as itself (one line, its exit code), else ``e``."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, NegsynthError):
        raise cause from None
    raise e


def first_line(e: BaseException) -> str:
    """The first line of ``e``'s message, or its type's name."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def ray_get(ray, refs):
    """``ray.get``, with a worker's negsynth error raised as itself."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as e:
        raise_cause(e)
