"""Peak live tensor memory of a block of code on the CPU (no CUDA allocator statistics there).

A ``TorchDispatchMode`` sees every tensor an operator creates; each storage is counted once
while any tensor created in the block still uses it, and the high-water mark of those bytes is
the block's peak. Tensors that existed before the block (weights, inputs) are not counted.
"""

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class PeakMemory(TorchDispatchMode):
    """``with PeakMemory() as m: ...`` then ``m.peak_bytes``."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, list] = {}  # storage ptr -> [bytes, n tensors alive]
        self.current = 0
        self.peak_bytes = 0

    def _release(self, ptr: int) -> None:
        entry = self.live.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[ptr]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr == 0:
                    continue
                if ptr in self.live:
                    self.live[ptr][1] += 1
                else:
                    self.live[ptr] = [storage.nbytes(), 1]
                    self.current += storage.nbytes()
                    self.peak_bytes = max(self.peak_bytes, self.current)
                weakref.finalize(t, self._release, ptr)
        return out
