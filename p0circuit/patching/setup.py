"""What a study patches, checked once where it enters: the :class:`Setup`.

The model, the tokens (against the run's BOS claim), the metric (by name or object, against the
model), the prepared corruption with all its parameters and the options are checked together, before
any forward. Every later step takes this checked value and checks nothing again: the patching job
(:class:`~p0circuit.patching.job.PatchJob`) and its methods, the result they return (which carries it,
``PatchResult.setup``), and the circuit searches that read a result (``faithful_circuit(result)``,
``faithful_edges(circuit)``, ``faithfulness_curve(result)``). A search handed another setup is refused,
naming what differs (:meth:`Setup.differences`). Records keep its description (:meth:`Setup.describe`),
never the model itself.
"""

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
from torch import Tensor

from p0circuit.core.args import entry_point
from p0circuit.core.errors import BadInputError, ConfigError, source_of, warn_user
from p0circuit.core.io import describe
from p0circuit.models.checks import check_model
from p0circuit.models.tokens import check_tokens
from p0circuit.patching.corruptions import Prepared, get_corruption
from p0circuit.patching.hooking import user_hooks
from p0circuit.patching.metrics import PatchMetric, check_metric, default_metric, resolve_metric
from p0circuit.patching.options import HOW, PatchOptions
from p0circuit.patching.weights import EMBEDDING, changed, digest, embedding_rows


def refuse_user_hooks(model: Any, fix: str = ", or pass reference=True, which runs every patch as a full forward "
                                                "with them") -> None:
    """Refuse a model that carries hooks of its own: the fast path (and every circuit search) runs only the
    blocks and positions a patch can change and reuses cached activations."""
    left = user_hooks(model)
    if left:
        raise BadInputError(
            f"the model carries hooks of its own at {', '.join(left[:5])}{' and more' if len(left) > 5 else ''}: the "
            "fast path runs only the blocks and positions a patch can change and reuses cached activations, so "
            "those hooks would fire on other tensors than in a full forward. Remove them (model.reset_hooks("
            f"including_permanent=True)){fix}")


class CleanRuns:
    """What a setup's clean run gave, kept for the setups that share it inside :func:`sharing_clean` (their
    :meth:`Setup.corrupting`): cached activations (:meth:`take`/:meth:`keep`, by the hooks kept, the block the run
    stopped before and whether it filled a key-value cache) and the metric's gradients (by the hooks and the stop
    block). A later request is served by a kept entry that holds every hook it asks for. Closed when the block ends:
    nothing is kept or given after it (a result made inside holds no activations, and a model changed afterwards --
    its configuration, a hook, its device -- is never answered from a run of before)."""

    def __init__(self) -> None:
        self.runs: list[tuple[frozenset, Any, bool, dict, Any]] = []
        self.grads: dict[tuple[frozenset, Any], tuple[float, dict]] = {}
        self.open = True

    def close(self) -> None:
        """Drop everything kept, and keep nothing more."""
        self.runs.clear()
        self.grads.clear()
        self.open = False

    def take(self, names: set, stop: Any, kv: bool) -> Optional[tuple[frozenset, dict, Any]]:
        """(the hooks held, their activations, the logits) of a kept clean run that holds ``names``, or None."""
        for held, s, k, acts, logits in self.runs if self.open else ():
            if s == stop and k == kv and names <= held:
                return held, acts, logits
        return None

    def gradients(self, names: set, stop: Any, compute: Any) -> tuple[float, dict]:
        """(the metric's value, its gradient at each hook of ``names``) of the clean run up to ``stop``: kept ones
        that hold ``names``, else ``compute()``'s, kept."""
        for (held, s), (value, grads) in self.grads.items() if self.open else ():
            if s == stop and names <= held:
                return value, grads
        value, grads = compute()
        if self.open:
            self.grads[(frozenset(names), stop)] = (value, grads)
        return value, grads

    def keep(self, names: set, stop: Any, kv: bool, acts: dict, logits: Any) -> None:
        """Keep a clean run in place of those whose hooks it holds."""
        if self.open:
            held = frozenset(names)
            self.runs = [(held, stop, kv, acts, logits)] + [r for r in self.runs if not (
                r[1] == stop and r[2] == kv and r[0] <= held)]


@contextmanager
def sharing_clean(setup: Any) -> Iterator["Setup"]:  # (checked here)
    """``setup`` with a store of its clean run (:class:`CleanRuns`) that the setups :meth:`Setup.corrupting` makes of
    it inside the block share: one clean forward (and one gradient) for every corruption compared, the same numbers.
    The store is closed when the block ends."""
    if not isinstance(setup, Setup):
        raise BadInputError(f"sharing_clean takes a p0circuit.Setup (Setup.of(model, tokens, ...)), got "
                            f"{type(setup).__name__}")
    store = CleanRuns()
    try:
        yield dataclasses.replace(setup, clean=store)
    finally:
        store.close()


@dataclass(frozen=True, eq=False)
class Setup:
    """What one study patches, checked: make it with :meth:`of` (or :meth:`check`), or take it from a
    result (``result.setup``)."""

    model: Any
    """The ``HookedTransformer`` (checked: finite weights, no hooks of its own on the fast path)."""
    tokens: Tensor
    """The clean prompts ``[batch, pos]``, checked against the model and ``options.bos``."""
    metric: PatchMetric
    """The metric object (a name resolved; None replaced by the default), checked against the model."""
    prep: Prepared
    """The corruption's prepared runs and alignment."""
    options: PatchOptions
    """The call's options: the corruption and metric as given, the BOS choice, direction, signal threshold."""
    weights: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)
    """What the setup's runs read of the model's weights when it was checked, as a digest per tensor
    (:mod:`p0circuit.patching.weights`): a search refuses a model whose digest moved since (:meth:`unchanged`)."""
    clean: Optional[CleanRuns] = dataclasses.field(default=None, repr=False, compare=False)
    """Inside :func:`sharing_clean`: the clean run's cached activations and gradients, shared by the setups
    :meth:`corrupting` makes of this one (the same model, weights, prompts and metric: the same clean run under every
    corruption). None elsewhere: each call runs its own."""

    @classmethod
    @entry_point
    def of(cls, model: Any, tokens: Any, **options: Any) -> "Setup":
        """A checked setup from keywords (``corruption=``, ``metric=``, ``bos=``, any :class:`PatchOptions` field)."""
        try:
            return cls.check(model, tokens, PatchOptions(**options))
        except TypeError as err:
            raise BadInputError(f"Setup.of: {err}; the options are {[f.name for f in dataclasses.fields(PatchOptions)]}"
                                ) from None

    def but(self, **changes: Any) -> "Setup":
        """The same checked setup with options that change how patches run, not what is patched
        (``direction``, ``min_signal``, ``rows_per_forward``, ``progress``, ``reference``): nothing is checked
        again but the model's own hooks, which the fast path refuses."""
        if set(changes) - set(HOW):
            raise BadInputError(f"Setup.but changes only {sorted(HOW)}; for another corruption, metric, BOS choice or "
                                "tokens make a new Setup.of(...), or use Setup.measuring(metric) for another metric")
        options = self.options.but(**changes)
        if not options.reference:
            refuse_user_hooks(self.model)
        if options.direction == "denoise" and self.prep.is_ablation:
            raise ConfigError(f"direction='denoise' needs a corrupted run, but {self.prep.name!r} is an ablation of the "
                              "clean run")
        return dataclasses.replace(self, options=options)

    @property
    def bos(self) -> Optional[bool]:
        """The run's BOS choice (``options.bos``)."""
        return self.options.bos

    @property
    def corruption(self) -> Any:
        """The corruption object (prepared: ``prep``)."""
        return self.prep.corruption

    def measuring(self, metric: Any) -> "Setup":
        """The same model, tokens and prepared corruption read by another ``metric`` (an object or a name, checked
        against the model): a study's second question of the same runs. The model is first checked to be as the setup
        was made (:meth:`still`: a setup made before a weight edit is refused, never re-baselined); then the weights
        the new metric's runs read are digested again (a later metric reads more blocks)."""
        self.still()
        resolved = resolve_metric(metric, self.model)
        if resolved is None:
            raise BadInputError("Setup.measuring needs a metric (an object such as p0circuit.NormRatio(2), or a name)")
        check_metric(resolved, self.model)
        options = dataclasses.replace(self.options, metric=metric)
        return dataclasses.replace(self, metric=resolved, options=options, clean=None,
                                   weights=digest(self.model, resolved, (self.tokens, self.prep.corrupt_tokens)))

    def corrupting(self, corruption: Any) -> "Setup":
        """The same model, tokens, metric and BOS choice under another ``corruption`` (a name or object), prepared and
        checked as :meth:`of` would; the clean run's products (:attr:`clean`) are shared where the weights it reads
        are still those this setup was checked with."""
        other = Setup.check(self.model, self.tokens, self.options.but(corruption=corruption))
        # the blocks' digests compare directly; the embedding's covers each setup's own corrupted rows too, so this
        # setup's rows are digested again (an edit since it was checked starts a store of its own)
        moved = [n for n in changed(self.weights, other.weights) if n != EMBEDDING]
        rows = self.weights.get(EMBEDDING)
        if self.clean is None or not self.clean.open or moved or not torch.equal(other.prep.clean_tokens, self.prep.clean_tokens) or (
                rows is not None and rows != embedding_rows(self.model, (self.tokens, self.prep.corrupt_tokens))):
            return other
        return dataclasses.replace(other, clean=self.clean)

    def rows(self, index: Any) -> "Setup":
        """The same study on a sub-batch of its prompts (``index``: a slice, or a list of rows), checked again, as
        a corruption that draws on the other prompts (``resample``) must be prepared on the rows it is given."""
        n = self.tokens.shape[0]
        if isinstance(index, slice):
            if index.step is not None and (isinstance(index.step, bool) or not isinstance(index.step, int) or index.step < 1):
                raise BadInputError(f"Setup.rows({index!r:.40}): a slice's step must be a whole number >= 1")
            picked = self.tokens[index]
        elif isinstance(index, (list, tuple)):
            bad = [i for i in index if isinstance(i, bool) or not isinstance(i, int) or not -n <= i < n]
            if bad:
                raise BadInputError(f"Setup.rows: index={index!r:.60} holds {bad[0]!r:.20}; give prompt rows as whole numbers "
                                    f"in 0..{n - 1} (the setup has {n} prompts)")
            picked = self.tokens[list(index)]
        else:
            raise BadInputError(f"Setup.rows takes a slice or a list of prompt rows, got {index!r:.40}")
        if picked.shape[0] == 0:
            raise BadInputError(f"Setup.rows({index!r:.40}) selects no prompt of the {self.tokens.shape[0]}")
        return Setup.check(self.model, picked, self.options)

    def describe(self) -> dict[str, Any]:
        """The record of what was patched (JSON-able; the model by name and dtype, the tokens by digest)."""
        cfg = self.model.cfg
        return {"model": str(cfg.model_name), "architecture": str(getattr(cfg, "original_architecture", None)),
                "dtype": str(cfg.dtype).replace("torch.", ""), "tokens": describe(self.tokens),
                "bos": self.options.bos, "corruption": self.prep.name, "corruption_params": self.prep.corruption.params(),
                "corruption_class": source_of(type(self.prep.corruption)),
                "metric": self.metric.name, "metric_params": self.metric.params(),
                "metric_class": source_of(type(self.metric))}

    def differences(self, other: "Setup", names: tuple[str, str] = ("this", "that")) -> list[str]:
        """What differs between two setups, one phrase each, the sides called ``names`` (empty: the same study)."""
        out = [] if self.model is other.model else ["the model (another HookedTransformer object)"]
        mine, theirs = self.describe(), other.describe()
        return out + [f"{k}: {names[0]} {mine[k]!r:.100}, {names[1]} {theirs[k]!r:.100}" for k in mine
                      if mine[k] != theirs[k] and not (k in ("model", "architecture") and out)]

    def unchanged(self, since: str = "the result was computed",
                  fix: str = "its numbers no longer describe this model; patch again") -> "Setup":
        """``self`` when the weights its runs read are still those it was checked with, else an error naming the
        tensors that changed ``since`` (a search runs on the model its result was measured on; a method given
        ``setup=`` on the model the setup was checked on)."""
        moved = changed(self.weights, digest(self.model, self.metric, (self.tokens, self.prep.corrupt_tokens)))
        if moved:
            raise BadInputError(f"the model's weights changed since {since} ({', '.join(moved[:4])}"
                                f"{' and more' if len(moved) > 4 else ''}: tensors its clean or corrupted runs read): "
                                f"{fix}")
        return self

    def still(self) -> "Setup":
        """``self`` when its model is still as it was checked (no hook of its own on the fast path, the same weights),
        else an error saying what changed: what a method given ``setup=`` asks before it runs."""
        if not self.options.reference:
            refuse_user_hooks(self.model)
        return self.unchanged("the setup was made", "make it again (p0circuit.Setup.of(...)) on the model as it is now")

    def same_as(self, other: Optional["Setup"], what: str) -> "Setup":
        """``self`` when ``other`` is None or the same study, else an error naming what differs."""
        if other is None or other is self:
            return self
        differ = self.differences(other, ("the result's", "given"))
        if differ:
            raise BadInputError(f"{what} was made with another setup ({'; '.join(differ)}): search the result of "
                                "the setup you mean, or patch again with this one")
        return self

    @classmethod
    @entry_point
    def check(cls, model: Any, tokens: Any, options: PatchOptions) -> "Setup":
        """Check everything a patching call is given, before any forward runs."""
        if not isinstance(options, PatchOptions):
            raise ConfigError(f"a patching call takes a PatchOptions, got {type(options).__name__}")
        check_model(model)
        tokens = check_tokens(model, tokens, min_len=2, bos=options.bos)
        metric = resolve_metric(options.metric, model)  # a metric by name, as corruptions are: "norm_ratio:2"
        metric = metric if metric is not None else default_metric(model.cfg.n_layers)
        check_metric(metric, model)
        if not options.reference:
            refuse_user_hooks(model)
        prep = get_corruption(options.corruption).prepare(model, tokens)
        if options.direction == "denoise" and prep.is_ablation:
            raise ConfigError(
                f"direction='denoise' needs a corrupted run, but {prep.name!r} is an ablation of the clean "
                "run; use direction='noise' or corruption 'shift'/'resample'"
            )
        return cls(model, tokens, metric, prep, options, digest(model, metric, (tokens, prep.corrupt_tokens)))


def __getattr__(name: str) -> Any:
    """``PatchInputs``, the former name of :class:`Setup`: the class, for this release only, with a ``FutureWarning``
    naming it (one name for one thing: ``Setup``)."""
    if name == "PatchInputs":
        warn_user("p0circuit.patching.setup.PatchInputs is the former name of p0circuit.Setup; the old name works for "
                  "this release only", FutureWarning)
        return Setup
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
