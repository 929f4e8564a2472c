"""Loading holds about one copy of the weights: peak resident memory while ``load_checkpoint`` runs, in a
fresh process (``benchmarks/load_memory.py``), is at most :data:`LIMIT` times the model's own size plus
:data:`FIXED`, in float32 and in bfloat16, each from a checkpoint stored in that dtype
(``benchmarks/bench_1b.py`` measures the same at 1.24B parameters).

The checkpoints are random-weight Llamas of 124M parameters (496 MB in float32) made with transformers'
own config class (what they measured, and what the loader before held: docs/performance.md).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LIMIT = 1.25
"""Peak resident memory during a load, over the model's own size."""
FIXED = 80 * 2**20
"""What a load allocates whatever the model's size: TransformerLens' causal masks (n_ctx**2 bytes per
layer, 25 MB here), the logit check's two forwards."""
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_load_holds_about_one_copy_of_the_weights(tmp_path, dtype):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_1b import make_checkpoint
    finally:
        sys.path.pop(0)
    checkpoint = make_checkpoint(tmp_path / "llama124m", "medium", dtype=dtype)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "load_memory.py"), str(checkpoint),
                          "--dtype", dtype], capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["dtype"] == f"torch.{dtype}"
    assert got["peak"] - got["before"] <= LIMIT * got["model_bytes"] + FIXED, got
