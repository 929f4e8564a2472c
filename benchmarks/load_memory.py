"""Peak resident memory of loading a checkpoint, in a fresh process, against the model's own size.

``python benchmarks/load_memory.py DIR [--dtype bfloat16]`` loads the Hugging Face checkpoint in DIR with
``p0circuit.load_checkpoint`` in this process (run it as its own process: the peak is the process's
whole life) and prints one JSON line: the resident memory before loading (torch and p0circuit imported),
the peak during it (``VmHWM``: anonymous memory and the checkpoint's memory-mapped pages alike), the
model's own size (the bytes of its parameters' storages, each once) and their ratio
``(peak - before) / size``. ``tests/test_load_memory.py`` and ``benchmarks/bench_1b.py`` run it.
"""

import argparse
import json
import time

import torch

import p0circuit as p0
from p0circuit.core import memory


def status(field: str) -> int:
    """A memory figure of this process (VmRSS: now; VmHWM: the peak), in bytes (:mod:`p0circuit.core.memory`)."""
    value = {"VmRSS": memory.resident, "VmHWM": memory.peak}[field]()
    if value is None:
        raise RuntimeError(f"/proc/self/status has no {field} (this measures on Linux only)")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    args = parser.parse_args()
    import transformer_lens  # noqa: F401  the libraries a load imports, imported first: their code is not the load's
    import transformers  # noqa: F401
    from p0circuit.models import checkpoints  # noqa: F401

    before = status("VmRSS")
    start = time.perf_counter()
    model = p0.load_checkpoint(args.path, dtype=getattr(torch, args.dtype))
    seconds = time.perf_counter() - start
    peak = status("VmHWM")
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    size = sum(storages.values())  # each storage once: tied embeddings share one
    print(json.dumps({"before": before, "peak": peak, "model_bytes": size, "ratio": (peak - before) / size,
                      "after": status("VmRSS"), "seconds": round(seconds, 2),
                      "dtype": str(model.cfg.dtype)}))


if __name__ == "__main__":
    main()
