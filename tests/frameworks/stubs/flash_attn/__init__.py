"""An import stand-in for flash-attn (a CUDA-only build), for OpenRLHF's modules to import on a CPU.

OpenRLHF imports ``flash_attn.bert_padding`` and ``flash_attn.utils.distributed`` at module level (its
ring-attention helpers); nothing that tests/frameworks runs calls them. Every function raises if called.
Only the OpenRLHF test environments put this folder on their path (the Makefile's .pth line).
"""

__version__ = "0.0.0+eerl-stub"


def _unavailable(*args: object, **kwargs: object) -> None:
    raise RuntimeError("flash-attn is not installed (CPU test environment): this stub cannot run it")
