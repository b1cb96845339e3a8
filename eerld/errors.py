"""The one error tree of eerld.

Every error eerld raises on purpose derives from :class:`DaemonError`; the API layer maps each branch to
one gRPC status code in one place, and anything outside this tree becomes INTERNAL with a generic message.

Two concepts are shared with the client and the job, and have their home in :mod:`eerl.errors`: a bad
configuration value and a bad field. eerld's :class:`ConfigError` and :class:`ValidationError` derive from
those (and from :class:`DaemonError`), so ``except eerl.errors.ValidationError`` catches a refused field
whichever side refused it, and both are ``ValueError`` s as the client's are.

    DaemonError
    ├── GpuError                  a GPU backend call failed (translated at the backend boundary)
    │   ├── NoPermission          the caller lacks the privilege (e.g. not root, no CAP_SYS_ADMIN)
    │   ├── NotSupported          the GPU or driver does not support the call
    │   ├── GpuLost               the GPU fell off the bus or the driver lost it
    │   ├── InvalidArgument       the backend rejected an argument (e.g. an unsupported clock)
    │   └── BackendFailure        any other backend error (uninitialised library, unknown NVML code)
    ├── ConfigError               bad daemon configuration (flag, config file, scenario file);
    │                             also an eerl.errors.ConfigError
    ├── ValidationError           a request field is missing or out of range; names the field;
    │                             also an eerl.errors.ValidationError
    ├── NotFound                  an unknown session, GPU or pin
    ├── Conflict                  the request collides with current state (GPU held, wrong phase order)
    ├── PermissionDenied          the caller may not do this (a GPU its socket was not granted)
    ├── Exhausted                 the caller is over a rate or concurrency bound; retry later
    └── Unavailable               the daemon is stopping or the resource is degraded
"""

from __future__ import annotations

from eerl import errors as shared


class DaemonError(Exception):
    """Root of every error eerld raises on purpose."""


EerlError = DaemonError
"""The root's old name, kept only while the simulator and the benchmark (``eerld.sim``, ``eerld.bench``,
moving into their own distribution, issue #36) still import it; new code says :class:`DaemonError`."""


class GpuError(DaemonError):
    """A GPU backend call failed; ``gpu_index`` is the GPU concerned when known."""

    def __init__(self, message: str, *, gpu_index: int | None = None) -> None:
        super().__init__(message)
        self.gpu_index = gpu_index


class NoPermission(GpuError):
    """The process lacks the privilege for this call (clock locks need root or CAP_SYS_ADMIN)."""


class NotSupported(GpuError):
    """The GPU, its driver or its mode (MIG, vGPU) does not support this call."""


class GpuLost(GpuError):
    """The GPU is gone (fell off the bus, driver reload) until it is recovered."""


class InvalidArgument(GpuError):
    """The backend rejected an argument, such as a clock outside the supported set."""


class BackendFailure(GpuError):
    """Any other backend failure: library not loaded, unknown error code, timeout."""


class ConfigError(DaemonError, shared.ConfigError):
    """A configuration value (flag, config file, scenario file) is invalid; the message names it."""


class ValidationError(DaemonError, shared.ValidationError):
    """A request field is missing or invalid; ``field`` names it (``ValidationError(field, problem)``)."""


class NotFound(DaemonError):
    """An unknown session, GPU or pin."""


class Conflict(DaemonError):
    """The request collides with current state: a GPU already held, a phase event out of order."""


class PermissionDenied(DaemonError):
    """The caller may not do this: another session's token, an admin call on the worker socket."""


class Unavailable(DaemonError):
    """The daemon is shutting down, or the resource is temporarily unusable."""


class Exhausted(DaemonError):
    """The caller is over one of its bounds (sessions opened per second through its socket); retry later."""
