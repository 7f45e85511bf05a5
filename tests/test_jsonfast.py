"""jsonfast writes the stdlib's bytes exactly (request-cache keys and record lines must not depend
on which encoder ran) and reads what the stdlib reads."""

from __future__ import annotations

import json
import random

import pytest

from negsynth.data import jsonfast

ODD = [
    "é\u2028x",
    'a"b\\',
    "\x00ctl",
    "😀",
    "\ud800",
    1e-05,
    1e16,
    0.7,
    0.1 + 0.2,
    2**70,
    -(2**63),
    2**63,
    True,
    None,
    float("nan"),
    float("inf"),
    (1, 2),
]


def random_value(r: random.Random, depth: int = 0):
    k = r.random()
    if depth > 3 or k < 0.35:
        return r.choice([*ODD, r.uniform(-1e20, 1e20), r.random() * 1e-6, r.randrange(-(10**20), 10**20)])
    if k < 0.65:
        return [random_value(r, depth + 1) for _ in range(r.randrange(4))]
    return {
        r.choice(["z", "a", "é", "b", 3]) if r.random() < 0.1 else r.choice(["z", "a", "é", "b"]) + str(i): random_value(r, depth + 1)
        for i in range(r.randrange(4))
    }


def stdlib(obj, sort_keys):
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys).encode("utf-8")
    except Exception as e:  # noqa: BLE001 - the exception type is what must match
        return type(e)


@pytest.mark.parametrize("sort_keys", [False, True])
def test_dumps_is_byte_identical_to_the_stdlib(sort_keys):
    r = random.Random(7)
    for _ in range(5000):
        obj = random_value(r)
        try:
            got = jsonfast.dumps(obj, sort_keys=sort_keys)
        except Exception as e:  # noqa: BLE001
            got = type(e)
        assert got == stdlib(obj, sort_keys), obj


def test_loads_reads_what_the_stdlib_reads():
    for text in ['{"a": [1, 2.5, "é"]}', "NaN", '{"x": Infinity}', '"\\ud800"', str(2**80), '{"a":1,"a":2}']:
        a, b = jsonfast.loads(text), json.loads(text)
        assert a == b or (a != a and b != b), text


def test_a_request_key_is_the_stdlib_hash():
    """Caches written before orjson was used keep their keys."""
    import hashlib

    from negsynth.llm.cache import request_key_and_body

    payload = {"model": "m", "messages": [{"role": "user", "content": "Grüße 😀"}], "temperature": 1e-05, "top_p": 0.95, "seed": 3}
    key, body = request_key_and_body(payload, 4)
    ref = json.dumps({"n": 4, "p": payload}, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    assert key == hashlib.sha256(ref).hexdigest() and json.loads(body) == payload
