"""The value rules of eerld's options: each turns a raw value into a typed one or raises ConfigError.

A raw value is a string from a flag or a typed value from the TOML file; ``label`` is what the error names
(the flag, or the file key of an option that has no flag). Every rule is a callable ``(value, label) -> T``
with a ``metavar`` that ``--help`` and docs/operations.md show. Nothing here knows which option uses it.
"""

from __future__ import annotations

import grp
import ipaddress
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from eerl.phases import PhaseKind

from eerld.errors import ConfigError

__all__ = [
    "Choice",
    "Float",
    "Int",
    "Or",
    "Rule",
    "fixed_clocks",
    "group",
    "host_port",
    "parse_fixed_clocks",
    "path",
    "text",
    "true_or_false",
    "value_rule",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Rule(Protocol[T_co]):
    """Turns a raw value into a typed one; ``metavar`` is how ``--help`` shows the value."""

    @property
    def metavar(self) -> str | None: ...

    def __call__(self, value: object, label: str, /) -> T_co: ...


@dataclass(frozen=True, slots=True)
class _Named(Generic[T]):
    """A plain function as a rule."""

    read: Callable[[object, str], T]
    metavar: str | None

    def __call__(self, value: object, label: str, /) -> T:
        return self.read(value, label)


def value_rule(metavar: str | None) -> Callable[[Callable[[object, str], T]], Rule[T]]:
    """A function ``(value, label) -> T`` as a rule, shown as ``metavar``."""

    def wrap(read: Callable[[object, str], T]) -> _Named[T]:
        return _Named(read, metavar)

    return wrap


@value_rule(None)
def text(value: object, label: str) -> str:
    """A non-empty string, stripped."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{label}: expected a non-empty string, got {value!r}")
    return value.strip()


@value_rule("PATH")
def path(value: object, label: str) -> Path:
    """A file system path (not checked for existence here)."""
    if not isinstance(value, str | Path) or not str(value):
        raise ConfigError(f"{label}: expected a path, got {value!r}")
    if "\0" in str(value):
        raise ConfigError(f"{label}: a path cannot contain a NUL character, got {str(value)!r}")
    return Path(value)


@value_rule(None)
def true_or_false(value: object, label: str) -> bool:
    """true or false (a flag without a value on the command line)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{label}: expected true or false, got {value!r}")
    return value


@value_rule("NAME")
def group(value: object, label: str) -> str:
    """The name of a group that exists on this host."""
    name = text(value, label)
    try:
        grp.getgrnam(name)
    except KeyError:
        raise ConfigError(f"{label}: no group named {name!r} on this host") from None
    return name


@value_rule("HOST:PORT")
def host_port(value: object, label: str) -> str:
    """``HOST:PORT``: an IP address or a host name, and a port 0–65535."""
    address = text(value, label)
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{label}: expected HOST:PORT, got {address!r}")
    Int(0, 65535)(port, f"{label} port")
    bare = host.strip("[]")
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        if not bare.replace("-", "").replace(".", "").isalnum():
            raise ConfigError(f"{label}: {host!r} is not a host name or IP address") from None
    return address


@dataclass(frozen=True, slots=True)
class Int:
    """An integer between ``minimum`` and ``maximum`` (a string of digits from a flag, an integer in TOML)."""

    minimum: int
    maximum: int
    metavar: str | None = "N"

    def __call__(self, value: object, label: str, /) -> int:
        if isinstance(value, bool):
            raise ConfigError(f"{label}: expected an integer, got {value!r}")
        try:
            number = int(value) if isinstance(value, int | str) else int(str(value), 10)
        except ValueError:
            raise ConfigError(f"{label}: expected an integer, got {value!r}") from None
        if not self.minimum <= number <= self.maximum:
            raise ConfigError(f"{label}: must be between {self.minimum} and {self.maximum}, got {number}")
        return number


@dataclass(frozen=True, slots=True)
class Float:
    """A finite number between ``minimum`` and ``maximum``."""

    minimum: float
    maximum: float
    metavar: str | None = "X"

    def __call__(self, value: object, label: str, /) -> float:
        if isinstance(value, bool):
            raise ConfigError(f"{label}: expected a number, got {value!r}")
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ConfigError(f"{label}: expected a number, got {value!r}") from None
        if not math.isfinite(number) or not self.minimum <= number <= self.maximum:
            raise ConfigError(
                f"{label}: must be a finite number between {self.minimum:g} and {self.maximum:g}, "
                f"got {value!r}"
            )
        return number


@dataclass(frozen=True, slots=True)
class Choice:
    """One of a fixed set of words."""

    choices: tuple[str, ...]

    @property
    def metavar(self) -> str:
        return "|".join(self.choices)

    def __call__(self, value: object, label: str, /) -> str:
        word = text(value, label)
        if word not in self.choices:
            raise ConfigError(f"{label}: expected one of {', '.join(self.choices)}, got {word!r}")
        return word


@dataclass(frozen=True, slots=True)
class Or(Generic[T]):
    """A word that stands for a value of its own (``off`` → None, ``auto`` → …), else ``then``'s rule."""

    word: str
    means: T
    then: Rule[T]

    @property
    def metavar(self) -> str | None:
        return f"{self.then.metavar or 'VALUE'}|{self.word}"

    def __call__(self, value: object, label: str, /) -> T:
        if isinstance(value, str) and value.strip() == self.word:
            return self.means
        return self.then(value, label)


def parse_fixed_clocks(text: str, *, source: str = "--fixed-clocks") -> dict[PhaseKind, int]:
    """``generation=1200,training=1500`` → clocks per phase kind."""
    result: dict[PhaseKind, int] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise ConfigError(f"{source}: expected KIND=MHZ, got {part.strip()!r}")
        result.update(_fixed_entry(name.strip(), value.strip(), source))
    return result


def _fixed_entry(name: str, value: object, source: str) -> dict[PhaseKind, int]:
    try:
        kind = PhaseKind(name)
    except ValueError:
        raise ConfigError(f"{source}: unknown phase kind {name!r} (generation or training)") from None
    return {kind: Int(1, 10_000)(value, f"{source} {name}")}


@value_rule("generation=MHZ,training=MHZ")
def fixed_clocks(value: object, label: str) -> Mapping[PhaseKind, int]:
    """Clocks per phase kind: ``generation=1200,training=1500`` from a flag, a table in TOML."""
    if isinstance(value, str):
        return parse_fixed_clocks(value, source=label)
    if isinstance(value, Mapping):
        parsed: dict[PhaseKind, int] = {}
        for k, v in value.items():
            parsed.update(_fixed_entry(str(k), v, "fixed_clocks"))
        return parsed
    raise ConfigError(f"{label}: expected generation=MHZ,training=MHZ, got {value!r}")
