"""How p0circuit shares the CPU: while other processes keep the cores busy, it uses no more threads than
the cores they leave free.

PyTorch's CPU kernels run on OpenMP threads (GNU libgomp in the PyPI wheels). Between two parallel
regions an idle libgomp thread *spins* before it sleeps. On a quiet machine that saves a wake-up per
kernel; on a machine where other processes want the same cores the spinning threads take time slices
from the threads that have work: a SmolLM2 forward with torch's default two threads was measured 3-15x
slower beside two busy processes than one thread under the same load (``benchmarks/bench_threads.py``,
docs/performance.md). A shorter spin (``GOMP_SPINCOUNT``, ``OMP_WAIT_POLICY=PASSIVE``) fixes the busy
case but was measured 10-40% slower on a quiet machine, and libgomp reads it only once, when torch loads.

So the policy is on the thread count, which torch can change at any time: :func:`adapt`, called by the
engine between its batches of patched forwards and by the analysis between steps, samples at most once
a second how many cores *other* processes used since its last look (``/proc/stat`` less this process's
own CPU time). Above :data:`BUSY` cores it gives torch no more threads than the cores the others leave
free: one on a small machine they keep busy (a single thread never waits for another, so nothing spins);
when the machine is quiet again it goes back to the count it started from.
A quiet machine pays nothing (two file reads a second), and it works the same when a notebook imported
torch before p0circuit.

The researcher's own forwards follow the same rule: every model p0circuit loads or builds, and every model
passed to one of its functions, carries a forward pre-hook (:func:`share`) that takes the same look before
each forward of the model, so ``model(tokens)``, ``run_with_cache`` and TransformerLens' patching in the same
notebook use no more threads than the cores other processes leave free either. The hook changes no tensor
and is not counted as a hook of the user's (the fast path refuses those); the first look is taken when
p0circuit is imported, so the first forward after it already knows how busy the machine was since.

A user's own choice always wins: with ``OMP_NUM_THREADS`` set (by the user, by :func:`set_threads` or
``--threads``), or a thread count other than torch's own default (:func:`default_threads`) found at the
first look, or one changed later to anything but what p0circuit set, p0circuit never changes the thread
count again; it also never raises it above the count it found. (One case cannot be told apart: a user
who sets exactly the count p0circuit chose; use ``OMP_NUM_THREADS`` or :func:`set_threads` to fix it.)
"""

import os
import sys
import time
from typing import Any, Optional

from p0circuit.core.args import entry_point
from p0circuit.core.errors import ConfigError
from p0circuit.core.hooks import OBSERVES

BUSY = 0.3
"""Cores' worth of other processes' CPU use, since the last look, above which p0circuit uses no more threads
than the cores the others leave free (one, on a machine they keep busy)."""
MIN_WALL = 0.25
"""Seconds a timed section must last for :class:`Contention` to judge it."""
INTERVAL = 1.0
"""Seconds between two looks at the machine (a look is two small file reads)."""


def _machine_cpu() -> Optional[float]:
    """CPU seconds every process of the machine has used (user + nice + system, /proc/stat); None where unread."""
    try:
        with open("/proc/stat") as f:
            return sum(int(x) for x in f.readline().split()[1:4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _own_cpu() -> float:
    """CPU seconds this process (all its threads) has used."""
    return sum(os.times()[:2])


def default_threads() -> int:
    """The thread count torch starts with when nobody chose one: one per physical core (hyper-threads
    counted once, as torch counts them), from /sys; the logical CPUs where that cannot be read."""
    try:
        cores = set()
        for cpu in os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1):
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/core_cpus_list") as f:
                cores.add(f.read().strip())
        return max(1, len(cores))
    except OSError:
        return os.cpu_count() or 1


class _Policy:
    """The adaptive thread count's state, one per process (see the module docstring)."""

    def __init__(self) -> None:
        self.found: Optional[int] = None  # torch's thread count at the first look: the most p0circuit uses
        self.chosen: Optional[int] = None  # what p0circuit last set or found: any other count is the user's
        self.off: Optional[str] = None  # why p0circuit leaves the thread count alone
        self.sample: Optional[tuple[float, float, float]] = None  # (time, machine CPU, own CPU) at the last look
        self.others = 0.0  # cores' worth of other processes' use over the last interval
        self.drops = 0  # how often it went below the count it found

    def first_look(self, current: int) -> None:
        """A count torch did not start with was the user's choice: left alone from then on."""
        if current != default_threads():
            self.off = f"the thread count was set to {current} before p0circuit's first look (torch.set_num_threads)"
        self.found = self.chosen = current

    def adapt(self) -> None:
        if self.off is not None:
            return
        torch = sys.modules.get("torch")
        if torch is None:
            return
        now = time.perf_counter()
        if self.sample is not None and now - self.sample[0] < INTERVAL:
            return
        if "OMP_NUM_THREADS" in os.environ:
            self.off = "OMP_NUM_THREADS is set"
            return
        current = torch.get_num_threads()
        if self.found is None:
            self.first_look(current)
            if self.off is not None:
                return
        elif current != self.chosen:
            self.off = f"the thread count was set to {current} outside p0circuit (torch.set_num_threads)"
            return
        machine, own = _machine_cpu(), _own_cpu()
        if machine is None:
            self.off = "/proc/stat cannot be read here"
            return
        if self.sample is not None:
            t0, m0, o0 = self.sample
            self.others = max(0.0, (machine - m0) - (own - o0)) / (now - t0)
            free = (os.cpu_count() or 1) - self.others  # the cores the others leave: one thread each at most
            want = self.found if self.others <= BUSY else max(1, min(self.found, int(free)))
            if want != current:
                torch.set_num_threads(want)
                self.drops += want < self.found
            self.chosen = want
        self.sample = (now, machine, own)


_POLICY = _Policy()


def adapt() -> None:
    """One look at the machine, at most once every :data:`INTERVAL` seconds: while other processes use
    more than :data:`BUSY` cores, as many threads as the cores they leave free (at least one), else the
    thread count found at the first look (unless the user chose a count: the module docstring)."""
    _POLICY.adapt()


def note_import() -> None:
    """Called when p0circuit is imported: if torch is loaded already (a notebook that imported it first),
    its thread count is looked at now, so that a count the user set before is known as theirs; and the
    machine's CPU time is sampled, so that the first forward's look sees how busy it was since."""
    torch = sys.modules.get("torch")
    if torch is not None and _POLICY.found is None and "OMP_NUM_THREADS" not in os.environ:
        _POLICY.first_look(torch.get_num_threads())
    if _POLICY.sample is None:
        machine = _machine_cpu()
        if machine is not None:
            _POLICY.sample = (time.perf_counter(), machine, _own_cpu())


def _look(module: Any, args: Any) -> None:
    """A forward pre-hook (:func:`share`): one look at the machine before the model's forward."""
    adapt()


setattr(_look, OBSERVES, True)


def share(model: Any) -> Any:
    """Give ``model`` (a torch module) the thread policy's look before each of its forwards, once: the user's
    own calls of it then share a busy machine as p0circuit's do (a user's thread choice still wins). Returns
    the model."""
    if not any(hook is _look for hook in model._forward_pre_hooks.values()):
        model.register_forward_pre_hook(_look)
    return model


@entry_point
def set_threads(threads: int) -> None:
    """Use ``threads`` CPU threads here and in child processes, always (``--threads`` on the command line).

    Sets ``OMP_NUM_THREADS``, so p0circuit no longer adapts the count; refuses anything but a positive
    whole number before torch is touched.
    """
    if threads < 1:
        raise ConfigError(f"threads={threads!r}: give a whole number of CPU threads, at least 1 (e.g. --threads 1 on "
                          "a busy machine)")
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def status() -> dict:
    """The policy in force (recorded by ``analyze``): the thread count now, who chose it, and what the last
    look at the machine saw."""
    torch = sys.modules.get("torch")
    return {
        "threads": torch.get_num_threads() if torch is not None else None,
        "policy": (f"fixed: {_POLICY.off}" if _POLICY.off else
                   f"adaptive: while other processes use more than {BUSY} cores, as many threads as the cores they "
                   f"leave (at least one), else {_POLICY.found}"),
        "others_cores": round(_POLICY.others, 2),
        "dropped": _POLICY.drops,
        "cpus": os.cpu_count(),
    }


class Contention:
    """A context that measures how many cores *other* processes used while it was open (``others``):
    the machine's CPU time less this process's, over the wall time. ``busy`` is true above :data:`BUSY`."""

    others = 0.0

    def __enter__(self) -> "Contention":
        self._t, self._machine, self._own = time.perf_counter(), _machine_cpu(), _own_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = max(time.perf_counter() - self._t, 1e-9)
        machine = _machine_cpu()
        if machine is not None and self._machine is not None:
            used = max(0.0, (machine - self._machine) - (_own_cpu() - self._own)) / self.wall
            self.others = min(used, float(os.cpu_count() or 1))

    @property
    def busy(self) -> bool:
        """Other processes used more than :data:`BUSY` cores, over a section long enough to tell (the kernel
        counts CPU time in 10 ms ticks: a shorter one says nothing)."""
        return self.others > BUSY and self.wall >= MIN_WALL

    def warning(self, what: str) -> str:
        """What a busy timing means and what to do, or empty on a quiet machine."""
        if not self.busy:
            return ""
        fix = (f"the thread count is fixed ({_POLICY.off}): on a busy machine use one thread (p0circuit.set_threads(1), "
               "--threads 1)" if _POLICY.off else "p0circuit uses fewer threads while they stay busy")
        return (f"{what} was timed while other processes used {self.others:.1f} of the machine's {os.cpu_count()} "
                f"cores: this run will be slower than on a quiet machine; {fix}")
