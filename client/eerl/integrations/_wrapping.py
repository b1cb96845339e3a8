"""Wrapping a method on one object and undoing it: how the hooks attach without a callback API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MISSING = object()


class Patches:
    """Instance attributes replaced by wrappers, remembered so that :meth:`undo` restores them."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def wrap(
        self, owner: Any, name: str, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> bool:
        """Replaces ``owner.name`` (if it exists and is callable) by ``make_wrapper(original)``."""
        original = getattr(owner, name, None)
        if owner is None or not callable(original):
            return False
        self._saved.append(
            (owner, name, owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING)
        )
        setattr(owner, name, make_wrapper(original))
        return True

    def undo(self) -> None:
        """Restores every wrapped attribute, newest first."""
        while self._saved:
            owner, name, saved = self._saved.pop()
            if saved is _MISSING:
                try:
                    delattr(owner, name)
                except AttributeError:  # pragma: no cover - the attribute went away meanwhile
                    continue
            else:
                setattr(owner, name, saved)
