"""Schemathesis hooks for tests/test_api_fuzz.py (loaded with SCHEMATHESIS_HOOKS): every answer
with a JSON body must parse as a browser's JSON.parse would, with no bare NaN or Infinity."""
from __future__ import annotations

import schemathesis

from tests.support.hostile import strict_loads


@schemathesis.check
def strict_json(ctx, response, case):
    """A JSON answer holds no NaN or Infinity (Python's json reads them; JSON.parse does not)."""
    if "json" not in (response.headers.get("content-type") or [""])[0] or not response.content:
        return None
    try:
        strict_loads(response.content.decode())
    except ValueError as e:
        raise AssertionError(f"the answer is not strict JSON: {e}") from None
    return None
