"""How a benchmark states what it measured: the conditions (date, cores, how busy the machine was)
and its table, written into a marked block of the docs (``tests/docblocks.py``), never by hand.

    with Conditions() as run:      # other processes' CPU use is measured meanwhile
        ...measure...
    publish("docs/performance.md", "sweep", run.header("bench_sweep.py") + "\\n\\n" + table)

``publish`` writes the block when the benchmark runs with ``--write-docs`` (or ``P0_WRITE_DOCS=1``),
and otherwise prints it, so a run for one's own curiosity leaves the docs alone.
"""

import datetime
import os
import threading
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import docblocks  # noqa: E402

QUIET = 0.1
"""Cores' worth of other processes' CPU use, on average, below which a run counts as quiet ..."""
QUIET_PEAK = 0.3
"""... and at most this much in any :data:`WINDOW` (a short burst beside a timed section shows there)."""
WINDOW = 5.0
"""Seconds of one window of the peak."""


def _machine_seconds() -> float:
    """CPU seconds every process of the machine has used (user + system, /proc/stat)."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2]) / os.sysconf("SC_CLK_TCK")


def _tree_seconds(root: int) -> float:
    """CPU seconds of process ``root`` and every process below it, running or finished (/proc)."""
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended meanwhile
        parent[int(entry)] = int(fields[1])
        used[int(entry)] = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
    mine = {root}
    for pid in sorted(parent):
        chain, seen = pid, set()
        while chain in parent and chain not in mine and chain not in seen:
            seen.add(chain)
            chain = parent[chain]
        if chain in mine:
            mine |= seen
    return sum(used.get(pid, 0.0) for pid in mine)


class Conditions:
    """A context that samples, once a second, how many cores other processes use while it is open
    (this process and its children excluded): the mean over the whole run and the peak over any
    :data:`WINDOW` seconds."""

    load = 0.0
    peak = 0.0
    seconds = 0.0

    def __enter__(self) -> "Conditions":
        self._samples = [(time.perf_counter(), _machine_seconds(), _tree_seconds(os.getpid()))]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            self._samples.append((time.perf_counter(), _machine_seconds(), _tree_seconds(os.getpid())))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._samples.append((time.perf_counter(), _machine_seconds(), _tree_seconds(os.getpid())))
        (t0, m0, o0), (t1, m1, o1) = self._samples[0], self._samples[-1]
        self.seconds = t1 - t0
        self.load = max(0.0, (m1 - m0) - (o1 - o0)) / max(self.seconds, 1e-9)
        self.peak = self.load
        for i, (ta, ma, oa) in enumerate(self._samples):
            for tb, mb, ob in self._samples[i + 1:]:
                if tb - ta >= WINDOW:
                    self.peak = max(self.peak, max(0.0, (mb - ma) - (ob - oa)) / (tb - ta))
                    break

    def state(self) -> str:
        """"quiet (...)" or "the machine was busy (...)": said beside every figure measured meanwhile."""
        said = f"other processes used {self.load:.0%} of a core on average, {self.peak:.0%} at most over {WINDOW:g} s"
        if self.load < QUIET and self.peak < QUIET_PEAK:
            return f"quiet ({said})"
        return f"the machine was busy: {said}"

    def header(self, script: str, device: str = "cpu") -> str:
        cores = os.cpu_count()
        where = f"{cores} CPU cores" if device == "cpu" else f"{device} ({cores} CPU cores)"
        return (f"Measured by `python benchmarks/{script}` on {datetime.date.today().isoformat()}, {where}; "
                f"{self.state()}.")


def publish(doc: str, name: str, text: str) -> None:
    """Write ``text`` into block ``name`` of ``doc`` with ``--write-docs`` or ``P0_WRITE_DOCS=1``;
    else print it."""
    if "--write-docs" in sys.argv or os.environ.get("P0_WRITE_DOCS") == "1":
        try:
            docblocks.write(doc, name, text)
            print(f"wrote {doc}, block {name!r}")
            return
        except LookupError:  # e.g. a device the docs hold no figures for yet
            print(f"{doc} has no block {name!r}; add <!-- measured:{name} --> ... <!-- /measured:{name} --> there")
    print(f"\n{doc}, block {name!r} (pass --write-docs to write it):\n{text}")
