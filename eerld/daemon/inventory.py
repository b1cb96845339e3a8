"""The node's GPUs as the daemon names them: identities, selectors → indices, supported clocks per GPU.

Read once from the backend when the daemon is built (the GPUs of a node do not change while it runs); a
GPU whose supported clocks cannot be read has none (``()``), so that one bad GPU never stops the daemon.
Every request that names GPUs is resolved here, so that an unknown GPU is refused the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import structlog
from eerl.clocks import nearest_supported_text
from eerl.phases import PhaseKind

from eerld.daemon.views import GpuInfoView
from eerld.errors import ConfigError, GpuError, NotFound, ValidationError
from eerld.gpu.base import GpuBackend, GpuIdentity
from eerld.sessions import GpuSelector

log = structlog.get_logger("eerld.daemon")


class Inventory:
    """The GPUs of one backend, by index and UUID, with the SM clocks each supports."""

    def __init__(self, backend: GpuBackend) -> None:
        self._backend = backend
        self.identities: tuple[GpuIdentity, ...] = tuple(backend.inventory())
        self._by_uuid = {g.uuid: g.index for g in self.identities}
        self._by_index = {g.index: g for g in self.identities}
        self._supported: dict[int, tuple[int, ...]] = {
            g.index: _supported_or_none(backend, g.index) for g in self.identities
        }

    def __len__(self) -> int:
        return len(self.identities)

    @property
    def indices(self) -> tuple[int, ...]:
        """Every GPU's index, in order."""
        return tuple(g.index for g in self.identities)

    def uuid(self, index: int) -> str:
        """The UUID of the GPU at ``index`` (a known index)."""
        return self._by_index[index].uuid

    def index_of(self, uuid: str) -> int | None:
        """The index of the GPU with ``uuid``; None when no GPU of this node has it."""
        return self._by_uuid.get(uuid)

    def supported_sm_clocks_mhz(self, index: int) -> tuple[int, ...]:
        """SM clocks the GPU supports, ascending; ``()`` when they could not be read."""
        return self._supported[index]

    def supported_mem_clocks_mhz(self, index: int) -> tuple[int, ...]:
        """Memory clocks the GPU supports, read now; ``()`` when the query fails."""
        try:
            return tuple(sorted(self._backend.supported_mem_clocks_mhz(index)))
        except GpuError:
            return ()

    def common_sm_clocks_mhz(self, indices: Sequence[int]) -> tuple[int, ...]:
        """SM clocks every one of the GPUs supports, ascending."""
        supported = set(self._supported[indices[0]])
        for index in indices[1:]:
            supported &= set(self._supported[index])
        return tuple(sorted(supported))

    def resolve(self, selectors: Sequence[GpuSelector]) -> tuple[int, ...]:
        """Indices of the selected GPUs; NotFound naming the field for an unknown GPU."""
        indices: list[int] = []
        for sel in selectors:
            if sel.uuid is not None:
                if sel.uuid not in self._by_uuid:
                    raise NotFound(f"{sel.field}: no GPU with UUID {sel.uuid!r} on this node")
                index = self._by_uuid[sel.uuid]
            else:
                assert sel.index is not None
                if sel.index not in self._by_index:
                    raise NotFound(
                        f"{sel.field}: no GPU with index {sel.index} on this node "
                        f"({len(self.identities)} GPUs: 0-{len(self.identities) - 1})"
                    )
                index = sel.index
            if index in indices:
                raise ValidationError(sel.field, f"GPU {index} is listed twice")
            indices.append(index)
        return tuple(indices)

    def select(self, selectors: Sequence[GpuSelector] | None) -> tuple[int, ...]:
        """:meth:`resolve`, where None selects every GPU of the node."""
        return self.indices if selectors is None else self.resolve(selectors)

    def info(self, index: int) -> GpuInfoView:
        """Static facts about the GPU at ``index``."""
        identity = self._by_index[index]
        supported = self._supported[index]
        return GpuInfoView(
            index=index,
            uuid=identity.uuid,
            name=identity.name,
            pci_bus_id=identity.pci_bus_id,
            min_sm_clock_mhz=min(supported) if supported else 0,
            max_sm_clock_mhz=max(supported) if supported else 0,
            supported_sm_clocks_mhz=supported,
        )

    def check_fixed_clocks(self, fixed_clocks_mhz: Mapping[PhaseKind, int]) -> None:
        """ConfigError naming ``--fixed-clocks`` when a clock is not supported by every GPU that says."""
        for kind, mhz in fixed_clocks_mhz.items():
            for index, supported in self._supported.items():
                if supported and mhz not in supported:
                    raise ConfigError(
                        f"--fixed-clocks: {kind.value}={mhz} MHz is not supported by GPU {index}; "
                        + nearest_supported_text(supported, mhz)
                    )


def _supported_or_none(backend: GpuBackend, index: int) -> tuple[int, ...]:
    """A GPU's supported SM clocks; () when the query fails, so one bad GPU never stops the daemon."""
    try:
        return tuple(sorted(backend.supported_sm_clocks_mhz(index)))
    except GpuError as e:
        log.warning("gpu_clocks_unknown", gpu_index=index, reason=f"{type(e).__name__}: {e}")
        return ()


__all__ = ["Inventory"]
