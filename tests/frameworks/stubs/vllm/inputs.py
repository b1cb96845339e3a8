"""Stub: see the package docstring."""

from typing import Any


def TokensPrompt(**kwargs: Any) -> dict[str, Any]:
    return dict(kwargs)
