"""How many layers of each llama.cpp model llama.cpp offloads to a GPU.

`--gpu-layers N` offloads N layers of every llama.cpp model of the pool, `--gpu-layers
MODEL=N` those of one model (its pool name, GGUF path or `ollama:`/`hf:`/`lmstudio:` spec,
as the chain names it), the latter winning; -1 offloads every layer, 0 (the default) none.
llama.cpp keeps the remaining layers, and the sampling, on the CPU; torch models are placed
by `--device` instead. A build of llama-cpp-python without a GPU backend refuses any offload
(backends/llamacpp.py), so asking for one on a CPU-only build is an error, never a silent
CPU run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specrouter.errors import InvalidParameterError

#: llama.cpp's value for "every layer".
ALL_LAYERS = -1


@dataclass(frozen=True)
class GpuLayers:
    default: int = 0
    per_model: tuple[tuple[str, int], ...] = ()

    def of(self, model: str) -> int:
        """The layers to offload for the model the chain names `model`."""
        return dict(self.per_model).get(model, self.default)

    @property
    def any(self) -> bool:
        return self.default != 0 or any(n != 0 for _, n in self.per_model)

    @classmethod
    def parse(cls, values: Sequence[str]) -> GpuLayers:
        """From --gpu-layers values: "N" (every model) or "MODEL=N" (one model), N >= -1."""
        default, per_model = None, {}
        for value in values:
            model, _, count = value.rpartition("=")
            try:
                layers = int(count)
            except ValueError:
                layers = None
            if layers is None or layers < ALL_LAYERS or (model == "" and "=" in value):
                raise InvalidParameterError(f"--gpu-layers takes N or MODEL=N with N an integer >= -1 "
                                            f"(-1: every layer), got {value!r}")
            if model:
                if model in per_model:
                    raise InvalidParameterError(f"--gpu-layers gives {model} twice")
                per_model[model] = layers
            elif default is not None:
                raise InvalidParameterError("--gpu-layers gives the layers of every model twice")
            else:
                default = layers
        return cls(default or 0, tuple(per_model.items()))
