"""The analysis' estimate of the time left (:mod:`p0circuit.studies.analysis.eta`), on a clock the test
moves: each kind of work is estimated at its own measured rate, a kind not yet seen at the rate so far,
a running part is credited as it goes and an overrunning one is not assumed done."""

import threading
import time

import pytest

from p0circuit.studies.analysis import eta
from p0circuit.studies.analysis.eta import Bar, kind_of


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Shown:
    """A stand-in for tqdm: what the bar was told (``history``: every count it showed)."""

    def __init__(self) -> None:
        self.history, self.total, self.postfix, self.closed = [0.0], None, "", False

    @property
    def n(self) -> float:
        return self.history[-1]

    @n.setter
    def n(self, value: float) -> None:
        self.history.append(value)

    def set_postfix_str(self, s: str, refresh: bool = True) -> None:
        self.postfix = s

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _bar(clock: Clock, sinks_s: float = 0.0) -> tuple[Bar, Shown]:
    """A bar whose plan so far is the sink report (2 predicted forwards), run for ``sinks_s`` if not 0."""
    shown = Shown()
    bar = Bar(shown, unit_s=0.5, clock=clock, tick_s=None)
    bar.plan({"s/sinks": 2.0}, final=False)
    if sinks_s:
        bar.running("s/sinks")
        clock.t += sinks_s
        bar.done("s/sinks")
    return bar, shown


def test_kinds_of_the_analysis_steps() -> None:
    assert [kind_of(p) for p in ("sinks", "pass", "curve", "search", "edges", "neurons", "corruptions@L3",
                                 "length48")] == ["sinks", "pass", "search", "search", "edges", "neurons", "pass", "pass"]


@pytest.fixture
def exact_rates(monkeypatch):
    monkeypatch.setattr(eta, "PRIOR", 0.0)  # each kind's rate is what its parts took, nothing weighed in


def test_no_total_until_the_plan_is_final() -> None:
    clock = Clock()
    bar, shown = _bar(clock)
    assert shown.total is None
    assert bar.estimate() == 2.0 * 0.5  # nothing ran: the plan at the forward's time


def test_each_kind_at_its_own_rate_and_unseen_kinds_at_the_rate_so_far(exact_rates) -> None:
    clock = Clock()
    bar, shown = _bar(clock, sinks_s=2.0)  # sinks: 1 s per predicted forward
    bar.plan({"s/P0@L3/nodes": 20.0, "s/corruptions@L3": 20.0, "s/P0@L3/neurons": 5.0},
             {"s/P0@L3/nodes": {"pass": 10.0, "curve": 2.0, "search": 8.0}})
    assert shown.total == 47
    bar.running("s/P0@L3/nodes")
    clock.t = 32.0
    bar.part("s/P0@L3/nodes", "pass")  # a pass: 3 s per forward
    # curve and search unseen: the rate so far, (2 + 30) / (2 + 10); corruptions: a pass; neurons unseen
    so_far = 32 / 12
    assert abs(bar.estimate() - (32 + 10 * so_far + 20 * 3 + 5 * so_far)) < 1e-9
    clock.t = 34.0
    bar.part("s/P0@L3/nodes", "curve")  # search: 1 s per forward
    clock.t = 42.0
    bar.done("s/P0@L3/nodes")
    assert abs(bar.estimate() - (42 + 20 * 3 + 5 * 42 / 22)) < 1e-9
    assert shown.n == 22.0


def test_a_running_part_is_credited_as_it_goes_and_an_overrun_is_not_assumed_done(exact_rates) -> None:
    clock = Clock()
    bar, shown = _bar(clock, sinks_s=2.0)
    bar.plan({"s/P0@L1/corruptions": 10.0, "s/length12": 4.0})
    bar.running("s/P0@L1/corruptions")  # expected 10 s at the rate so far (1 s per forward)
    clock.t = 7.0
    bar._show()
    assert shown.n == 2.0 + 5.0  # half its expected time: half its forwards
    assert abs(bar.estimate() - (7 + 5 + 4)) < 1e-9
    clock.t = 22.0  # 20 s into a part expected to take 10: assumed a tenth of its time from its end
    bar._show()
    assert abs(bar.estimate() - (22 + 2 + 4)) < 1e-9
    assert 2.0 < shown.n < 12.0 and "left" in shown.postfix and "s/P0@L1/corruptions" in shown.postfix


def test_a_step_that_does_not_run_is_credited_without_changing_the_rates(exact_rates) -> None:
    clock = Clock()
    bar, shown = _bar(clock, sinks_s=4.0)
    bar.plan({"s/P0@L1/neurons": 6.0, "s/length12": 4.0})
    bar.done("s/P0@L1/neurons")  # skipped (no massive dimension)
    assert shown.n == 8.0 and bar.seconds == {"sinks": 4.0}
    assert abs(bar.estimate() - (4 + 4 * 2)) < 1e-9


def test_a_tiny_first_part_does_not_set_its_kinds_rate_alone() -> None:
    """A node pass of a tenth of a forward that took 1 s (fixed costs) against a forward of 1 s: the rest
    of the passes are estimated nearer the rate so far than at 10 s per forward."""
    clock = Clock()
    shown = Shown()
    bar = Bar(shown, unit_s=1.0, clock=clock, tick_s=None)
    bar.plan({"s/P0@L0/nodes": 0.1, "s/corruptions@L0": 20.0})
    bar.running("s/P0@L0/nodes")
    clock.t = 1.0
    bar.done("s/P0@L0/nodes")
    overall = (1.0 + eta.PRIOR * 1.0) / (0.1 + eta.PRIOR)
    assert bar._rate("pass") == pytest.approx((1.0 + eta.PRIOR * overall) / (0.1 + eta.PRIOR))
    assert bar._rate("pass") < 3.0  # not 10


def test_the_thread_records_the_estimate_and_stops_at_close() -> None:
    shown = Shown()
    bar = Bar(shown, unit_s=0.1, tick_s=0.01)
    bar.plan({"s/sinks": 1.0})
    bar.running("s/sinks")  # expected 0.1 s: the thread moves the bar while it runs
    time.sleep(0.2)
    moved = len(set(shown.history))
    bar.done("s/sinks")
    bar.close()
    log = bar.log()
    assert len(log) >= 5 and shown.closed and moved >= 3
    assert not any(t.name == "p0circuit-eta" for t in threading.enumerate())
    assert log[-1][0] == log[-1][1]  # at the end the estimate is the time taken
    assert [t for t, _ in log] == sorted(t for t, _ in log)


def test_the_count_never_goes_back_and_a_finished_bar_ends_full() -> None:
    clock = Clock()
    bar, shown = _bar(clock, sinks_s=1.0)
    bar.plan({"s/P0@L1/corruptions": 10.3, "s/length12": 4.4})  # a total of 17 shown for 16.7 forwards
    bar.running("s/P0@L1/corruptions")
    for t in range(2, 60):  # far past its estimate: its share stays where it was
        clock.t = t / 3 + 30
        bar._show()
    bar.done("s/P0@L1/corruptions")
    bar.done("s/length12")
    bar.close()
    assert shown.history == sorted(shown.history) and shown.n == shown.total == 17


def test_a_bar_left_early_ends_where_it_stood() -> None:
    clock = Clock()
    bar, shown = _bar(clock, sinks_s=1.0)
    bar.plan({"s/P0@L1/corruptions": 10.0})
    bar.close()  # (an error or an interrupt in the step)
    assert shown.n == 2.0 < shown.total


def test_the_record_of_a_long_run_stays_short_and_even() -> None:
    clock = Clock()
    bar, _ = _bar(clock)
    for t in range(1, 5001):  # a tick a second for 83 minutes
        clock.t = float(t)
        bar._record(clock.t)
    times = [t for t, _ in bar.log()]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(times) <= eta.LOG_POINTS and times[0] == 1.0 and times[-1] > 5000 - 2 * 5000 / eta.LOG_POINTS
    assert max(gaps) <= 2 * min(gaps) and max(gaps) <= 2 * 5000 / eta.LOG_POINTS  # spread over the whole run


def test_a_jupyter_bar_gets_its_total_when_the_plan_is_final() -> None:
    """tqdm.notebook draws a bar made without a total as a full 20px block of maximum 1; the plan gives the
    widget its maximum and width."""
    from types import SimpleNamespace

    widget = SimpleNamespace(bar_style="info", max=1, layout=SimpleNamespace(width="20px"))
    shown = Shown()
    shown.container, shown.ncols, shown.disable = SimpleNamespace(children=(None, widget, None)), None, False
    bar = Bar(shown, unit_s=1.0, clock=Clock(), tick_s=None)
    bar.plan({"s/sinks": 2.0}, final=False)
    assert widget.max == 1
    bar.plan({"s/length12": 40.0})
    assert (widget.max, widget.bar_style, widget.layout.width, shown.total) == (42, "", None, 42)
