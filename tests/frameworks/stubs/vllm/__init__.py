"""An import stand-in for vLLM (GPU-only, about 900 MB), for OpenRLHF's modules to import on a CPU.

OpenRLHF imports ``vllm.SamplingParams``, ``vllm.inputs.TokensPrompt`` and ``vllm.utils.random_uuid`` at
module level; tests/frameworks replaces the vLLM engines themselves by local stand-ins, so nothing here
generates. ``SamplingParams`` keeps its keyword arguments; the engine classes raise if used.
Only the OpenRLHF test environments put this folder on their path (the Makefile's .pth line).
"""

from typing import Any

__version__ = "0.0.0+eerl-stub"


class SamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


class _Unavailable:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("vLLM is not installed (CPU test environment): this stub cannot run it")


AsyncEngineArgs = AsyncLLMEngine = LLM = _Unavailable
