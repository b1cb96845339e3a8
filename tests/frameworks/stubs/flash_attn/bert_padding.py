"""Stub: see the package docstring."""

from flash_attn import _unavailable

index_first_axis = pad_input = rearrange = unpad_input = _unavailable
