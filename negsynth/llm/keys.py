"""Reading an API key from the environment variable or file a run file names, for ``[llm]`` and
for each of ``llm.endpoints``: one set of checks and messages (never the key itself)."""

from __future__ import annotations

import os
import unicodedata

from negsynth.errors import UserError


def read_key(env: str | None, file: str | None, where: str, error: type[Exception] = UserError) -> str | None:
    """The key from ``{where}.api_key_env`` or ``{where}.api_key_file``; None when neither is set.

    A missing variable, an unreadable, empty or non-UTF-8 file, and a key with a line break or an
    invisible character raise ``error`` with one line naming the setting and the fix."""
    if env:
        v = os.environ.get(env, "").strip()
        if not v:
            raise error(f"environment variable {env} ({where}.api_key_env) is not set; export it or change {where}.api_key_env")
        return one_line_key(v, f"environment variable {env} ({where}.api_key_env)", error)
    if file:
        try:
            v = open(os.path.expanduser(file), encoding="utf-8").read().strip()
        except OSError as e:
            raise error(f"cannot read {where}.api_key_file {file}: {e.strerror}; fix the path") from None
        except UnicodeDecodeError:
            raise error(f"{where}.api_key_file {file} is not UTF-8 text; it must hold the key on one line") from None
        if not v:
            raise error(f"{where}.api_key_file {file} is empty; put the key in it")
        return one_line_key(v, f"{where}.api_key_file {file}", error)
    return None


def one_line_key(key: str, where: str, error: type[Exception] = UserError) -> str:
    """An HTTP header cannot hold a line break or control character, and no key holds an invisible
    one (a pasted zero-width space, a no-break space, a byte-order mark) or any other non-ASCII
    character (a look-alike letter pasted from a document; the SDK's HTTP client cannot send
    one): say which and where, at start-up, instead of a traceback or a 401 later."""
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise error(f"the API key in {where} contains a line break or control character; it must be one line (never shown here)")
    for i, c in enumerate(key):
        if ord(c) <= 127:
            continue
        name = f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed')}"
        if c.isspace() or unicodedata.category(c) in ("Cf", "Zs", "Zl", "Zp", "Cc", "Co", "Cn"):
            raise error(
                f"the API key in {where} contains the invisible character {name} at position {i + 1} "
                "(a copy-paste accident?); remove it (the key is never shown here)"
            )
        raise error(
            f"the API key in {where} has the non-ASCII character {name} at position {i + 1}, which API keys never have "
            "(a look-alike letter pasted?); fix it (the key is never shown here)"
        )
    return key
