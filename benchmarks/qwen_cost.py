"""What Qwen2.5-Coder-0.5B-Instruct (``real:qwen2.5``) costs to load and run on this machine, beside a forward
timed in the same process.

Two fresh processes, one after the other, each loading ``p0.load_qwen25()`` with ``P0CIRCUIT_CACHE`` set to a new
temporary directory: the first joins the six parts, converts and caches (what a user's first load does), the
second loads from that cache (every later load). Each reports its load time, its peak resident memory
(``VmHWM``, the whole process: libraries included) against the GGUF file's size and the float32 weights', and
one forward of 8 English prompts x 24 tokens (no BOS; the fastest of 5 after a warm-up). Times are stated as
forwards of the same process, as the machine's speed varies from day to day. ``OMP_WAIT_POLICY=PASSIVE`` is set
before torch is imported.

``python benchmarks/qwen_cost.py [--write-docs]`` writes the blocks ``qwen-cost`` of docs/performance.md and
``qwen-load`` of docs/models.md.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported, here and in the children
os.environ.setdefault("TQDM_DISABLE", "1")

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from record import Conditions, publish  # noqa: E402

GIB = 2**30


def child() -> None:
    """One load and its forwards, in this process; prints one JSON line."""
    import logging
    import time

    import torch

    import p0circuit as p0
    from p0circuit.core import memory
    from p0circuit.models import gguf, qwen  # noqa: F401  (imported before the load: their import is not its cost)

    logging.disable(logging.WARNING)
    before = memory.resident()
    start = time.perf_counter()
    model = p0.load_qwen25()
    load = time.perf_counter() - start
    load_peak = memory.peak()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    tokens = p0.english_prompts(model, 8, 24, prepend_bos=False)
    with torch.no_grad():
        model(tokens)  # warm-up
        times = []
        for _ in range(5):
            start = time.perf_counter()
            model(tokens)
            times.append(time.perf_counter() - start)
    print(json.dumps({"load": load, "forward": min(times), "before": before, "load_peak": load_peak,
                      "peak": memory.peak(), "weights": weights, "params": sum(p.numel() for p in model.parameters()),
                      "threads": torch.get_num_threads(), "variant": model.cfg.variant}))


def run_child(cache: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child"], env={**os.environ, "P0CIRCUIT_CACHE": cache},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from p0circuit.models.qwen import SIZE

    with tempfile.TemporaryDirectory(prefix="p0qwen") as cache, Conditions() as run:
        first, cached = run_child(cache), run_child(cache)
    header = run.header("qwen_cost.py")
    f, c = first, cached

    def mem(r: dict, key: str) -> str:
        peak, grown = r[key] / GIB, (r[key] - r["before"]) / GIB
        return (f"{peak:.2f} GiB peak resident ({grown:.2f} GiB above the {r['before'] / GIB:.2f} GiB of the libraries "
                f"before it): {r[key] / SIZE:.1f}x the {SIZE / 1e6:.0f} MB file, {r[key] / r['weights']:.2f}x the "
                f"{r['weights'] / GIB:.2f} GiB float32 weights")

    table = (
        f"{header} The model: {c['variant']}; {c['params'] / 1e6:.0f}M parameters in the hooked model (the "
        f"file stores the unembedding apart from the embedding). Each load in a fresh process ({c['threads']} torch "
        f"thread{'s' if c['threads'] != 1 else ''}), timed as forwards of 8 x 24 tokens of the same process:\n\n"
        "| | time | in forwards | memory |\n|---|---|---|---|\n"
        f"| one forward, 8 x 24 tokens | {c['forward'] * 1000:.0f} ms (first process: {f['forward'] * 1000:.0f} ms) "
        "| 1 | "
        f"{mem(c, 'peak')} after the forwards |\n"
        f"| `load_qwen25()`, from the conversion cache | {c['load']:.1f} s | {c['load'] / c['forward']:.1f} | "
        f"{mem(c, 'load_peak')} |\n"
        f"| `load_qwen25()`, first (join the parts, dequantize, convert, check logits, cache) | {f['load']:.1f} s | "
        f"{f['load'] / f['forward']:.0f} | {mem(f, 'load_peak')} |")
    publish("docs/performance.md", "qwen-cost", table)
    short = (f"{header} Loading from the conversion cache: {c['load']:.1f} s ({c['load'] / c['forward']:.1f} "
             f"forwards of 8 x 24 tokens, one forward {c['forward'] * 1000:.0f} ms); the first load, which joins the "
             f"parts and converts: {f['load']:.1f} s. Peak resident memory: {c['load_peak'] / GIB:.2f} GiB from the "
             f"cache, {f['load_peak'] / GIB:.2f} GiB on the first load, against the {SIZE / 1e6:.0f} MB file and "
             f"{c['weights'] / GIB:.2f} GiB of float32 weights ([performance.md](performance.md#qwen25-05b-load-memory-"
             f"and-a-forward-benchmarksqwen_costpy)).")
    publish("docs/models.md", "qwen-load", short)


if __name__ == "__main__":
    child() if "--child" in sys.argv else main()
