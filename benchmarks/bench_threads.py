"""How p0circuit shares a busy machine: its thread policy quiet and beside busy processes, in one run.

Each measurement is a fresh Python process (libgomp reads its settings once, when torch loads), under
one of these policies:

* ``p0circuit``: its adaptive thread count (``core/threads.py``: one thread while other processes keep
  the cores busy), looked at before each forward as the engine does before each batch of patched forwards;
* ``torch``: torch's own threads and libgomp's default spin (the policy switched off: p0circuit before it);
* ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (a thread sleeps as soon as it waits);
* ``one``: one thread (``OMP_NUM_THREADS=1``), the fair-share yardstick;
* ``spin=N``: ``GOMP_SPINCOUNT=N``, a shorter spin than libgomp's 300,000 (the alternative policy, measured).

and three workloads: ``forward`` (SmolLM2-135M, 8 x 24 tokens, median of several forwards after a warm-up),
``plain`` (the same forwards as a researcher's own ``model(tokens)`` of the model ``p0.load_smollm2()`` returns,
with no call of p0circuit's between them: the model's own look, ``core/threads.share``, is the policy; issue
52) and ``analysis`` (``p0.analyze`` of SmolLM2-135M without BOS, 4 prompts x 16 tokens: a short analysis, wall
time). Each runs quiet and beside
``--busy`` processes that spin in plain Python (one per core by default: two on this machine), started
before and stopped after that measurement.

Goals (issue 42): beside two busy processes the policy's forward within 1.5x of a one-thread forward
under the same load; quiet, the policy costs at most 5% over torch's default. The results are printed
and written to ``benchmarks/results/threads.json``; the ratios go to docs/performance.md.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from record import publish  # noqa: E402

CHILD = r"""
import os, sys, time, json, statistics
what, adaptive = sys.argv[1], sys.argv[2] == "adaptive"
import p0circuit as p0
import torch
from p0circuit.core import threads
if not adaptive:
    threads.adapt = lambda: None  # the policy switched off: torch's own threads (what p0circuit did before it;
    # the model's look before each forward, threads._look, calls this module's adapt too)
    from p0circuit.patching import engine
    engine.adapt = threads.adapt
if what in ("forward", "plain"):
    model = p0.load_smollm2()
    tokens = p0.english_prompts(model, 8, 24, prepend_bos=False)
    with torch.no_grad():
        model(tokens)
        times = []
        for _ in range(int(sys.argv[3])):
            if what == "forward":
                threads.adapt()  # as the engine does before each batch of patched forwards
            t = time.perf_counter(); model(tokens); times.append(time.perf_counter() - t)
    print(json.dumps({"seconds": statistics.median(times), "threads": torch.get_num_threads()}))
else:
    model = p0.load_smollm2()
    t = time.perf_counter()
    p0.analyze(model, progress=False, n_prompts=4, length=16, bos=(False,))
    print(json.dumps({"seconds": time.perf_counter() - t, "threads": torch.get_num_threads()}))
"""

POLICIES = {
    "p0circuit": ({}, "adaptive"),
    "torch": ({}, "fixed"),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, "fixed"),
    "one": ({"OMP_NUM_THREADS": "1"}, "fixed"),
}


def policy(name: str) -> tuple[dict, str]:
    if name.startswith("spin="):
        return {"GOMP_SPINCOUNT": name.split("=", 1)[1]}, "fixed"
    return POLICIES[name]


def measure(what: str, name: str, repeats: int) -> float:
    env_extra, order = policy(name)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    env.update(env_extra, TQDM_DISABLE="1")
    out = subprocess.run([sys.executable, "-c", CHILD, what, order, str(repeats)], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


BURNERS = {
    "python": "while True: pass",
    "torch": "import torch\na = torch.randn(256, 256)\nwhile True: a = torch.tanh(a @ a)",
}
"""What a busy process runs: a plain Python loop (one thread), or torch with its default threads and spin
(another researcher's job: small kernels, so its threads wait between them as p0circuit's do)."""


def busy(n: int, kind: str) -> list[subprocess.Popen]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    return [subprocess.Popen([sys.executable, "-c", BURNERS[kind]], env=env) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default="p0circuit,torch,passive,one")
    parser.add_argument("--analysis-policies", default="p0circuit,torch,one")
    parser.add_argument("--what", default="forward,analysis")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy processes beside the busy runs")
    parser.add_argument("--burner", choices=sorted(BURNERS), default="torch", help="what the busy processes run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the policies (the median is kept)")
    parser.add_argument("--analysis-rounds", type=int, default=1, help="rounds of the (longer) analysis")
    parser.add_argument("--repeats", type=int, default=5, help="forwards timed per process (the median is kept)")
    args = parser.parse_args()
    before_load = open("/proc/loadavg").read().split()[0]
    rows = []
    for what in args.what.split(","):
        for load in ("quiet", "busy"):
            seconds: dict[str, list[float]] = {}
            forwards = what in ("forward", "plain")
            for _ in range(args.rounds if forwards else args.analysis_rounds):  # the policies interleaved,
                # so that a slow spell of the machine hits them all
                for name in args.policies.split(",") if forwards else args.analysis_policies.split(","):
                    burners = busy(args.busy, args.burner) if load == "busy" else []
                    try:
                        time.sleep(2 if burners else 0)
                        seconds.setdefault(name, []).append(measure(what, name, args.repeats))
                    finally:
                        for p in burners:
                            p.kill()
                            p.wait()
                    print(what, load, name, round(seconds[name][-1], 3), flush=True)
            rows += [{"what": what, "load": load, "policy": name, "seconds": round(statistics.median(s), 3),
                      "rounds": [round(x, 3) for x in s]} for name, s in seconds.items()]
    ratios = {}
    for what in args.what.split(","):
        get = {(r["load"], r["policy"]): r["seconds"] for r in rows if r["what"] == what}
        for load in ("quiet", "busy"):
            for name in [n for (l, n) in get if l == load]:
                if name != "one" and (load, "one") in get:
                    ratios[f"{what} {load}: {name} / one thread"] = round(get[load, name] / get[load, "one"], 2)
                if name != "torch" and (load, "torch") in get:
                    ratios[f"{what} {load}: {name} / torch default"] = round(get[load, name] / get[load, "torch"], 2)
    for k, v in ratios.items():
        print(f"{k}: {v}")
    out = Path(__file__).parent / "results" / "threads.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "busy_processes": args.busy, "rows": rows,
                               "ratios": ratios}, indent=1))
    header = (f"Measured by `python benchmarks/bench_threads.py` on {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU "
              f"cores (load average {before_load} before, {open('/proc/loadavg').read().split()[0]} after); busy = "
              f"beside {args.busy} busy processes (one per core), each running "
              f"`{BURNERS[args.burner].replace(chr(10), '; ')}`; forwards: medians of {args.rounds} rounds, "
              f"the analysis: {args.analysis_rounds}, the policies interleaved, each a fresh process.")
    for block, kinds in (("threads", ("forward", "analysis")), ("threads-plain", ("plain",))):
        mine = [r for r in rows if r["what"] in kinds]
        if not mine:
            continue
        table = "\n".join(["| workload | load | policy | seconds (median) | each round |", "| --- | --- | --- | --- | --- |"]
                          + [f"| {r['what']} | {r['load']} | {r['policy']} | {r['seconds']} | {r['rounds']} |" for r in mine])
        table += "\n\n" + "\n".join(f"- {k}: **{v}**" for k, v in ratios.items() if k.split()[0] in kinds)
        publish("docs/performance.md", block, header + "\n\n" + table)


if __name__ == "__main__":
    main()
