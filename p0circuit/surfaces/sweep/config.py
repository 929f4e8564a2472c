"""Sweep configuration: a TOML file describing a grid over models, prompt sets, corruptions,
methods and metrics. Every key is validated; errors name the key and the valid choices.

Example::

    [sweep]
    models = ["planted:rope", "planted:nope", "checkpoint:/data/my-model"]   # or spec:<family>, hub:<name>
    prompts = ["auto"]                    # auto | english | random | regular (auto: english text with a tokenizer)
    corruptions = ["shift", "pos_mean", "resample"]
    methods = ["activation", "path"]
    metrics = ["sink_heads"]              # sink_heads | attn_to_p0 | norm_ratio:<layer>
    n_prompts = 16
    seq_len = 32
    seed = 0
    threshold = 0.1
"""

import hashlib
import itertools
import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Union

from p0circuit.core.defaults import CIRCUIT_THRESHOLD
from p0circuit.core.plugins import load_plugins
from p0circuit.core.errors import ConfigError, from_known_keys, nearest
from p0circuit.core.args import entry_point
from p0circuit.core.entries import check_metric_entry, check_model_entry, entry_layers
from p0circuit.core.entries import PROMPT_SOURCES
from p0circuit.core.choices import offered

PROMPT_SETS = PROMPT_SOURCES


def _check_list(name: str, values: Any) -> list[str]:
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        raise ConfigError(f"sweep.{name} must be a non-empty list of strings, got {values!r}")
    return values


def _check_choices(name: str, values: list[str], choices: Iterable[str]) -> None:
    bad = [v for v in values if v not in choices]
    if bad:
        raise ConfigError(f"sweep.{name}: {bad} not valid{nearest(bad[0], list(choices))}; choose from {sorted(choices)}")


def _check_each(name: str, values: list[str], check: Callable[[str], Any]) -> None:
    for v in values:
        try:
            check(v)
        except ConfigError as e:
            raise ConfigError(f"sweep.{name}: {e}") from None


@entry_point  # __post_init__ checks every field with a message that names the fix
@dataclass(frozen=True)
class SweepConfig:
    """A grid of patching runs."""

    plugins: list[str] = field(default_factory=list)
    """Modules (names or ``.py`` files) imported first, so that the corruptions, metrics, methods and
    model families they register can be named below (:mod:`p0circuit.core.plugins`)."""
    models: list[str] = field(default_factory=lambda: ["planted:rope"])
    """Model entries (:mod:`p0circuit.models.resolve`): ``planted:<variant>``, ``spec:<family>``,
    ``checkpoint:<path>``, ``hub:<name>``."""
    prompts: list[str] = field(default_factory=lambda: ["auto"])
    """Prompt sets: ``english`` (the shipped natural-English passages, cut to ``seq_len``; needs a
    tokenizer), ``random`` (uniform ids), ``regular`` (random ids where only position 0 looks like a
    start; see :func:`p0circuit.models.tokens.probe_tokens`) or ``auto`` (the default: english for a model
    with a tokenizer, regular for one without; the record says which ran). None holds a BOS id."""
    corruptions: list[str] = field(default_factory=lambda: ["shift"])
    """Corruption names."""
    methods: list[str] = field(default_factory=lambda: ["activation"])
    """Patching methods."""
    metrics: list[str] = field(default_factory=lambda: ["sink_heads"])
    """``sink_heads`` (planted models), ``attn_to_p0`` (layers >= 2) or ``norm_ratio:<layer>``."""
    n_prompts: int = 16
    """Prompts per cell."""
    seq_len: int = 32
    """Tokens per prompt."""
    seed: int = 0
    """Seed of the prompts and corruptions."""
    threshold: float = CIRCUIT_THRESHOLD
    """Normalized-effect threshold of the circuits."""

    def __post_init__(self) -> None:
        if not isinstance(self.plugins, list) or not all(isinstance(p, str) for p in self.plugins):
            raise ConfigError(f"sweep.plugins must be a list of module names or .py files, got {self.plugins!r}")
        load_plugins(self.plugins)  # before the names are checked: a plugin's names are valid here
        for name in ("models", "prompts", "corruptions", "methods", "metrics"):
            object.__setattr__(self, name, _check_list(name, getattr(self, name)))
        _check_each("models", self.models, check_model_entry)
        for model in self.models:  # a metric past the last block of a model whose size is known without loading it
            _check_each("metrics", self.metrics, lambda m: check_metric_entry(m, entry_layers(model)))
        _check_choices("prompts", self.prompts, PROMPT_SETS)
        _check_choices("corruptions", self.corruptions, offered("CORRUPTIONS"))  # the registries' names, and
        _check_choices("methods", self.methods, offered("METHODS"))  # a plugin's, without importing torch
        for name in ("n_prompts", "seq_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 2:
                raise ConfigError(f"sweep.{name} must be an integer >= 2, got {v!r}")
        # threshold: RANGES['threshold'] (p0circuit.core.args), checked with every field by @entry_point
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ConfigError(f"sweep.seed must be an integer in 0..2**63-1, got {self.seed!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SweepConfig":
        """From the ``[sweep]`` table; unknown keys are named with the valid ones."""
        return from_known_keys(cls, d, "sweep")  # type: ignore[return-value]

    @classmethod
    @entry_point
    def load(cls, path: Union[str, Path]) -> "SweepConfig":
        """Read a TOML file with a ``[sweep]`` table."""
        path = Path(path)
        if not path.is_file():
            near = sorted(q.name for q in path.parent.glob("*.toml")) if path.parent.is_dir() else []
            raise ConfigError(f"sweep config {str(path)!r} does not exist; "
                              + (f"{path.parent} holds {', '.join(near[:8])}" if near else
                                 "the repository's configs/ holds examples (configs/demo.toml)"))
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path} is not valid TOML: {e}") from None
        extra = sorted(set(data) - {"sweep"})
        if "sweep" not in data or extra:
            raise ConfigError(f"{path} must hold exactly one [sweep] table (found {sorted(data)})")
        return cls.from_dict(data["sweep"])

    def cells(self) -> list["Cell"]:
        """Every cell of the grid, in a stable order."""
        grid = itertools.product(self.models, self.prompts, self.corruptions, self.methods, self.metrics)
        return [Cell(*combo, n_prompts=self.n_prompts, seq_len=self.seq_len, seed=self.seed,
                     threshold=self.threshold) for combo in grid]


@entry_point
@dataclass(frozen=True)
class Cell:
    """One run of the grid (its fields are checked as a sweep of this one cell's would be)."""

    model: str
    """Model entry."""
    prompts: str
    """Prompt set."""
    corruption: str
    """Corruption name."""
    method: str
    """Patching method."""
    metric: str
    """Metric entry."""
    n_prompts: int
    """Prompts."""
    seq_len: int
    """Tokens per prompt."""
    seed: int
    """Seed."""
    threshold: float
    """Circuit threshold."""

    def __post_init__(self) -> None:
        try:
            SweepConfig(models=[self.model], prompts=[self.prompts], corruptions=[self.corruption], methods=[self.method],
                        metrics=[self.metric], n_prompts=self.n_prompts, seq_len=self.seq_len, seed=self.seed,
                        threshold=self.threshold)
        except ConfigError as err:  # "sweep.methods: ..." as the cell's own field
            raise ConfigError(f"Cell: {str(err).removeprefix('sweep.')}") from None

    @property
    def key(self) -> str:
        """Stable identifier: a hash of every field."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def label(self) -> str:
        """Short human-readable description."""
        return f"{self.model} | {self.prompts} | {self.corruption} | {self.method} | {self.metric}"
