"""The analysis' progress bar and its estimate of the time left.

The bar counts the plan's work in forwards of the prompt batch, as :mod:`.cost` predicts them before
the run. The cost model gets the *relative* costs of the work roughly right on one model and less so on
another (at 1.24B parameters a node pass runs faster than predicted, relative to the circuit search;
docs/performance.md), so the time left is not read off one average rate. Each part of the plan has a
*kind* (:data:`KINDS`): the sink report, a node patching pass, a search, the edge step, the neuron
screen. Once a part of a kind has run, the rest of that kind is estimated at that kind's measured seconds
per predicted forward, and a kind not yet seen at the rate of everything so far (before anything has
run: one forward timed before the steps); a kind's first small parts are weighed against that rate
(:data:`PRIOR`). A part that runs is credited as it goes (its predicted share of its expected time), so
the bar moves during long steps, and a part that outlasts its estimate is assumed a tenth from its end.

A thread refreshes the bar and records the estimate every second while the steps run, also when the
bar is hidden: ``log()`` is the list of (seconds since the start, estimated total seconds) that
``analysis.json`` keeps under ``timing.eta``, the record the benchmarks judge the estimate by.
"""

import threading
import time
from typing import Any, Callable, Optional

KINDS = {"sinks": "sinks", "pass": "pass", "corruptions": "pass", "length": "pass", "edges": "edges",
         "curve": "search", "search": "search", "neurons": "neurons"}
"""A part's name (a step's last word, without its layer or length) -> the kind whose rate estimates it.
Node patching passes (an onset's, and those of the other corruptions and lengths) share one rate; the
faithfulness curve and the circuit search, whose evaluations corrupt every node outside a circuit, another;
the path patching of the edge step and the neuron screen one each."""
LOG_POINTS = 600
"""The most points :meth:`Bar.log` keeps (one a second until then)."""
PRIOR = 1.0
"""Predicted forwards of evidence the prior rate counts as: a kind's rate is (its seconds + PRIOR x the rate
so far) / (its predicted forwards + PRIOR), so that a part of a fraction of a forward, whose time is mostly
fixed costs, does not set the rate of a long one alone."""


def kind_of(part: str) -> str:
    """``"length48"`` -> ``"pass"``; ``"corruptions@L3"`` -> ``"pass"``; ``"curve"`` -> ``"search"``."""
    name = part.split("@")[0].rstrip("0123456789")
    return KINDS.get(name, "pass")


class Bar:
    """The analysis' bar: :meth:`plan` the steps (each with parts, or one part named after the step),
    :meth:`running` when a step starts, :meth:`part` as each of its parts ends, :meth:`done` when it ends
    (or will not run), :meth:`close` at the end."""

    def __init__(self, bar: Any, unit_s: float, clock: Callable[[], float] = time.perf_counter,
                 tick_s: Optional[float] = 1.0) -> None:
        self.bar, self.unit_s, self.clock = bar, unit_s, clock
        self.costs: dict[str, float] = {}
        """Step key -> its predicted forwards (the sum of its parts)."""
        self.parts: dict[str, dict[str, float]] = {}
        self.seconds: dict[str, float] = {}
        """Kind -> seconds measured on its parts in this call."""
        self.units: dict[str, float] = {}
        """Kind -> predicted forwards of those parts."""
        self.timed: dict[str, float] = {}
        """``step/part`` -> the seconds it ran (in this call)."""
        self.credited = 0.0
        self.current: Optional[tuple[str, str, float]] = None
        """(step, part, its start) of the part running now."""
        self.start = clock()
        self._log: list[tuple[float, float]] = []
        self._spacing = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if tick_s:
            self._thread = threading.Thread(target=self._ticks, args=(tick_s,), daemon=True, name="p0circuit-eta")
            self._thread.start()

    def plan(self, costs: dict[str, float], parts: Optional[dict[str, dict[str, float]]] = None,
             final: bool = True) -> None:
        """Add steps ``key -> predicted forwards``; ``parts`` splits some of them ``key -> {part: forwards}``
        (summing to the step's), in the order they run. Until a ``final`` plan the bar shows no total (the
        first steps decide what follows)."""
        with self._lock:
            for key, units in costs.items():
                self.costs[key] = units
                self.parts[key] = dict((parts or {}).get(key) or {key.rsplit("/", 1)[-1]: units})
            if final:
                _set_total(self.bar, round(sum(self.costs.values())))
            self._show()

    def running(self, key: str) -> None:
        """Step ``key`` started."""
        with self._lock:
            self.current = (key, next(iter(self.parts.get(key) or {"": 0})), self.clock())
            self._show()

    def part(self, key: str, name: str) -> None:
        """Part ``name`` of step ``key`` ended (the next one, if any, starts)."""
        with self._lock:
            self._end_part(key, name)
            rest = list(self.parts.get(key) or {})
            self.current = (key, rest[0], self.clock()) if rest else None
            self._show()

    def done(self, key: str) -> None:
        """Step ``key`` ended, or will not run (its parts are credited; timed only if it ran)."""
        with self._lock:
            for name in list(self.parts.get(key) or {}):
                self._end_part(key, name)
            self.current = None
            self._show()

    def estimate(self) -> float:
        """Estimated total seconds of the steps, from the start."""
        with self._lock:
            return self._estimate(self.clock())

    def log(self) -> list[list[float]]:
        """(seconds since the start, estimated total seconds) every second and at every part's end."""
        with self._lock:
            return [[round(t, 1), round(e, 1)] for t, e in self._log]

    def close(self) -> None:
        """Stop the thread; a bar whose every planned step was credited ends full (its total is rounded),
        one left early (an error, an interrupt) where it stood."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            now = self.clock()
            self._log.append((now - self.start, now - self.start))
            if self.bar.total and not any(self.parts.values()):
                self.bar.n = self.bar.total
                self.bar.refresh()
        self.bar.close()

    # the estimate

    def _rate(self, kind: str) -> float:
        """Seconds per predicted forward for a part of ``kind``: what its parts took, and the rate of
        everything so far (before anything: the timed forward) as :data:`PRIOR` forwards of evidence."""
        def weighed(seconds: float, units: float, prior: float) -> float:
            return (seconds + PRIOR * prior) / (units + PRIOR) if units + PRIOR > 0 else prior

        overall = weighed(sum(self.seconds.values()), sum(self.units.values()), self.unit_s)
        return weighed(self.seconds.get(kind, 0.0), self.units.get(kind, 0.0), overall)

    def _running(self, now: float) -> tuple[float, float]:
        """(the running part's expected seconds left, its predicted forwards credited so far)."""
        if self.current is None:
            return 0.0, 0.0
        key, name, began = self.current
        units = self.parts.get(key, {}).get(name, 0.0)
        expected, spent = units * self._rate(kind_of(name)), now - began
        if expected <= 0:
            return 0.0, 0.0
        if spent >= expected / 1.1:  # outlasting its estimate: assume a tenth of its time from its end
            return 0.1 * spent, units / 1.1
        return expected - spent, units * spent / expected

    def _estimate(self, now: float) -> float:
        left, _ = self._running(now)
        running = self.current[:2] if self.current else None
        for key, parts in self.parts.items():
            for name, units in parts.items():
                if (key, name) != running:
                    left += units * self._rate(kind_of(name))
        return now - self.start + left

    def _end_part(self, key: str, name: str) -> None:
        units = self.parts.get(key, {}).pop(name, None)
        if units is None:
            return
        if self.current is not None and self.current[:2] == (key, name):
            kind, took = kind_of(name), self.clock() - self.current[2]
            self.seconds[kind] = self.seconds.get(kind, 0.0) + took
            self.units[kind] = self.units.get(kind, 0.0) + units
            self.timed[f"{key}/{name}" if name != key.rsplit("/", 1)[-1] else key] = round(took, 2)
        self.credited += units
        self._record(self.clock())

    def _show(self) -> None:
        now = self.clock()
        _, partial = self._running(now)
        shown = max(self.bar.n, self.credited + partial)  # never back (an overrunning part's share is flat)
        self.bar.n = min(shown, self.bar.total or float("inf"))  # (the total is rounded)
        step = self.current[0] if self.current else ""
        left = f"about {_clock(self._estimate(now) - (now - self.start))} left" if self.bar.total else ""
        self.bar.set_postfix_str(", ".join(p for p in (left, step) if p), refresh=False)  # (no total: no time left)
        self.bar.refresh()

    def _ticks(self, every: float) -> None:
        while not self._stop.wait(every):
            with self._lock:
                self._record(self.clock())
                self._show()

    def _record(self, now: float) -> None:
        """Add the estimate at ``now`` to the log, kept to at most :data:`LOG_POINTS` points spread evenly
        over the run (when it is full every other point is dropped, and points closer than the spacing left
        are not recorded)."""
        t = now - self.start
        if self._log and t < self._log[-1][0] + self._spacing:
            return
        self._log.append((t, self._estimate(now)))
        if len(self._log) > LOG_POINTS:
            self._log, self._spacing = self._log[::2], 2 * max(self._spacing, t / LOG_POINTS)


def _set_total(bar: Any, total: float) -> None:
    """Give ``bar`` its total; a Jupyter widget bar made without one also gets its maximum and width."""
    container = getattr(bar, "container", None)  # tqdm.notebook's widget (its reset does the same)
    if container is not None and not getattr(bar, "disable", False):
        _, widget, _ = container.children
        widget.bar_style, widget.max = "", total
        if not bar.total and bar.ncols is None:
            widget.layout.width = None
    bar.total = total


def _clock(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"
