"""The options every patching method shares, defined once: :class:`PatchOptions`.

A method is written against one options object and called with keywords::

    @takes_options(without=("reference",))
    def my_method(model, tokens, *, nodes=None, options: PatchOptions) -> PatchResult:
        job = PatchJob(model, tokens, options)
        ...

    my_method(model, tokens, corruption="swap", min_signal=0)       # keywords, checked by name
    my_method(model, tokens, options=PatchOptions(direction="denoise"), progress=True)

:func:`takes_options` gives the method a signature with each option it takes as a keyword (so
``help()`` and Jupyter show them, with their defaults), checks each against its annotation and
range before any work, and builds the :class:`PatchOptions` the body receives. An option a method
cannot use is not in its signature: passing it is an error naming the method, never dropped (a
``PatchOptions`` that sets it is refused the same way).
"""

import dataclasses
import functools
import inspect
import typing
from typing import Any, Callable, Literal, Optional, Union

from p0circuit.core.args import entry_point
from p0circuit.core.errors import BadCallError, ConfigError
from p0circuit.patching.corruptions import Corruption
from p0circuit.patching.metrics import MetricSpec

Direction = Literal["noise", "denoise"]
"""``noise``: corrupted values into the clean run; ``denoise``: clean values into the corrupted run."""


@entry_point
@dataclasses.dataclass(frozen=True)
class PatchOptions:
    """What is corrupted, what is measured, and how the patched forwards run."""

    corruption: Union[str, Corruption] = "shift"
    """A corruption name (``p0circuit.CORRUPTIONS``) or object (``p0circuit.Shift(2)``)."""
    metric: Optional[MetricSpec] = None
    """A metric object or entry (``"norm_ratio:2"``); None: attention to P0 of every head from block 2
    on (block n_layers - 1 in a model of at most 2 blocks; :func:`p0circuit.patching.metrics.default_metric`)."""
    direction: Direction = "noise"
    """``noise``: corrupted values into the clean run; ``denoise``: clean values into the corrupted run."""
    min_signal: float = 0.05
    """The smallest |clean - corrupted| metric change that counts as signal: a share of the larger of the two,
    or an absolute change in the metric's unit where it has one (``LogitMetric``: logits)."""
    bos: Optional[bool] = None
    """The run's BOS choice, checked against the tokens (None makes no claim)."""
    rows_per_forward: Optional[int] = None
    """Prompt rows per patched forward (default: 8 copies of the prompts)."""
    reference: bool = False
    """Run every patch as a full forward (the slow path the fast one is tested against)."""
    progress: bool = False
    """Show a progress bar with an ETA."""

    def __post_init__(self) -> None:
        """A corruption or metric named by a string is looked up here, before any model is given: a name that names
        nothing is refused at once (a block past a model's is refused when the model is)."""
        from p0circuit.core.entries import check_metric_entry
        from p0circuit.patching.corruptions import get_corruption

        if isinstance(self.corruption, str):
            get_corruption(self.corruption)
        if isinstance(self.metric, str):
            check_metric_entry(self.metric)

    def but(self, **changes: Any) -> "PatchOptions":
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(PatchOptions))
"""The option names, in order."""
DEFAULTS = PatchOptions()
_HINTS = inspect.get_annotations(PatchOptions, eval_str=True)

F = typing.TypeVar("F", bound=Callable[..., Any])


def unused(options: PatchOptions, taken: tuple[str, ...]) -> list[str]:
    """The options ``options`` sets away from their defaults that a method taking ``taken`` cannot use."""
    return [k for k in FIELDS if k not in taken and getattr(options, k) != getattr(DEFAULTS, k)]


def taken_by(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The options ``fn`` takes (a method made with :func:`takes_options`, or a partial of one)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "options_taken", ())


HOW = ("direction", "min_signal", "rows_per_forward", "progress", "reference")
"""The options that change how a checked setup's patches run, not what is patched (:meth:`~p0circuit.Setup.but`)."""


def _from_setup(name: str, setup: Any, model_tokens: list[Any], options: Optional[PatchOptions],
                given: dict[str, Any], taken: tuple[str, ...]) -> tuple[Any, ...]:
    """``(model, tokens)`` and the keywords a method's body gets from ``setup=`` (the checked :class:`~p0circuit.Setup`
    it runs on: only that its model still is as it was checked, :meth:`~p0circuit.Setup.still`), or an error naming
    what else was passed that the setup already fixes, or an option of the setup's the method does not take."""
    # a Setup (setup.py, which imports this module) is known by what it holds: its checked options and ``but``
    if not (isinstance(getattr(setup, "options", None), PatchOptions) and callable(getattr(setup, "but", None))):
        raise BadCallError(f"{name}: setup={setup!r:.40} is not a p0circuit.Setup; make one with p0circuit.Setup.of(model, "
                           "tokens, corruption=..., metric=..., bos=...)")
    if any(x is not None for x in model_tokens) or options is not None:
        raise BadCallError(f"{name}: pass setup= alone or the model, tokens and options, not both (the setup holds "
                           "its model, tokens and options, checked)")
    fixed = [k for k in given if k not in HOW]
    if fixed:
        other = {"metric": " or setup.measuring(metric)", "corruption": " or setup.corrupting(corruption)"}
        raise BadCallError(f"{name}: the setup fixes {fixed[0]}= ({fixed[0]}={getattr(setup.options, fixed[0])!r:.60}); for "
                           f"another, make another p0circuit.Setup.of(...){other.get(fixed[0], '')}; of the options, only "
                           f"{', '.join(k for k in HOW if k in taken)} may be given beside setup=")
    refused = unused(setup.options, taken)
    if refused:
        raise BadCallError(f"{name} does not take {refused[0]}= (the setup's options.{refused[0]}="
                           f"{getattr(setup.options, refused[0])!r}): it uses {', '.join(taken)}")
    setup = (setup.but(**given) if given else setup).still()
    return setup.model, setup.tokens, {"options": setup.options, "setup": setup}


@entry_point
def takes_options(*, without: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Give ``fn(model, tokens, *, ..., options: PatchOptions)`` every option but ``without`` as a keyword.

    The wrapped function takes ``options=`` (a :class:`PatchOptions`, default all defaults) and any
    option by name, which overrides it; ``fn`` always receives one complete :class:`PatchOptions`.
    """
    unknown = [n for n in without if n not in FIELDS]
    if unknown:
        raise ConfigError(f"takes_options(without=...): {unknown} are not options; the options are {list(FIELDS)}")
    taken = tuple(n for n in FIELDS if n not in without)

    def wrap(fn: F) -> F:
        sig = inspect.signature(fn)
        if "options" not in sig.parameters:
            raise ConfigError(f"{fn.__qualname__} must take options= (a PatchOptions) to be given the shared options")
        name = fn.__qualname__

        takes_setup = "setup" in sig.parameters

        @functools.wraps(fn)
        def call(*args: Any, options: Optional[PatchOptions] = None, **kwargs: Any) -> Any:
            given = {k: kwargs.pop(k) for k in [k for k in kwargs if k in FIELDS]}
            refused = [k for k in given if k not in taken]
            if refused:
                raise BadCallError(f"{name} does not take {refused[0]}=: it uses {', '.join(taken)}")
            if options is not None and not isinstance(options, PatchOptions):
                raise BadCallError(f"{name}: options={options!r:.40} is not a PatchOptions; pass "
                                   "p0circuit.PatchOptions(...) or the options as keywords")
            setup = kwargs.pop("setup", None) if takes_setup else None
            model_tokens = list(args[:2]) + [kwargs.pop(k) for k in ("model", "tokens") if k in kwargs]
            if setup is not None:
                model, tokens, extra = _from_setup(name, setup, model_tokens, options, given, taken)
                return fn(model, tokens, *args[2:], **extra, **kwargs)
            if takes_setup and (len(model_tokens) < 2 or any(x is None for x in model_tokens)):
                raise BadCallError(f"{name} needs the model and the tokens (or setup=p0circuit.Setup.of(model, tokens, "
                                   "corruption=..., metric=..., bos=...))")
            base = DEFAULTS if options is None else options
            refused = unused(base, taken)
            if refused:
                raise BadCallError(f"{name} does not take {refused[0]}= (options.{refused[0]}="
                                   f"{getattr(base, refused[0])!r}): it uses {', '.join(taken)}")
            return fn(*model_tokens, *args[2:], options=base.but(**given) if given else base, **kwargs)

        own = [p for p in sig.parameters.values() if p.name != "options"]
        keywords = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=getattr(DEFAULTS, n),
                                      annotation=_HINTS[n]) for n in taken]
        tail = inspect.Parameter("options", inspect.Parameter.KEYWORD_ONLY, default=None,
                                 annotation=Optional[PatchOptions])
        call.__signature__ = sig.replace(parameters=own + keywords + [tail])  # type: ignore[attr-defined]
        try:
            hints = inspect.get_annotations(fn, eval_str=True)
        except Exception:  # an annotation that cannot be resolved is not checked (as in args._hints)
            hints = {}
        call.__annotations__ = {**{k: v for k, v in hints.items() if k != "options"},
                                **{n: _HINTS[n] for n in taken}, "options": Optional[PatchOptions]}
        call.options_taken = taken  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return wrap
