"""What one analysis measures: :class:`AnalysisSettings`, checked when made, and :func:`precheck` of the
directory it is to go to. Imports no torch, so that ``p0circuit analyze`` refuses a bad option, or a
directory holding another analysis, in well under a second, before the model is loaded."""

import ast
import functools
import inspect
import json
import math
import textwrap
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Optional

from p0circuit.core.defaults import CIRCUIT_THRESHOLD, NORM_THRESHOLD
from p0circuit.core.args import RATIO_LINE
from p0circuit.core.errors import ConfigError
from p0circuit.studies.analysis.records import StateFile

STATE = "analysis.state.json"
"""The file an analysis directory keeps its finished steps in."""
MAX_COUNT = 10**9
"""The largest count a setting takes (prompts, tokens, onsets, ...): past it a number is a typo, not a plan."""
MAX_IG_STEPS = 64
"""The most integrated-gradient points per MLP an analysis takes (the default, 4, is checked against exact
patching in docs/guide.md)."""


def _named(name: str) -> str:
    """``n_prompts (--n-prompts)``: the setting, and its option where ``p0circuit analyze`` has one."""
    return f"{name} (--{name.replace('_', '-')})" if name in number_fields() else name


@functools.lru_cache(maxsize=None)
def number_fields() -> dict[str, tuple[object, str]]:
    """``name -> (default, first sentence of its docstring)`` of each number field of :class:`AnalysisSettings`:
    ``p0circuit analyze``'s options and their help. The field docstrings are read from this class's own source
    (Python keeps no attribute docstrings at run time)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(AnalysisSettings)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: dict[str, tuple[object, str]] = {}
    for stmt, after in zip(body, body[1:] + [None]):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        default = {f.name: f.default for f in fields(AnalysisSettings)}[stmt.target.id]
        if type(default) not in (int, float):
            continue
        doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else ""
        out[stmt.target.id] = (default, " ".join(str(doc).split()).split(". ")[0].rstrip("."))
    return out


@typing.no_type_check  # validates its own fields in __post_init__, naming each one's command-line option
@dataclass(frozen=True)
class AnalysisSettings:
    """What one analysis measures (every field is recorded in ``analysis.json``).

    Example::

        >>> import p0circuit as p0
        >>> s = p0.AnalysisSettings(n_prompts=4)
        >>> s.n_prompts, s.norm_threshold, s.threshold
        (4, 5.0, 0.1)
    """

    n_prompts: int = 8
    """Prompts per measurement (natural English when the model has a tokenizer, else regular random ids); docs/guide.md
    compares 8 with 16 on SmolLM2."""
    length: int = 24
    """Tokens of text per prompt; a BOS token adds one."""
    bos: tuple[bool, ...] = (False, True)
    """BOS settings measured (``True`` is skipped, with the reason, for a model without a start token)."""
    threshold: float = CIRCUIT_THRESHOLD
    """|normalized effect| at which a node, edge or neuron is kept."""
    norm_threshold: float = NORM_THRESHOLD
    """Norm ratio at which a position counts as a sink state."""
    max_onsets: int = 1
    """Onsets of the P0 norm ratio patched per BOS setting, in layer order. The first is the paper's; a later one
    (SmolLM2's second amplification at layer 11) costs the most, since its node pass grows with the square of its
    depth: opt in with 2 or more (``--max-onsets``). ``analysis.md`` names the onsets left out and their predicted
    cost."""
    max_sinks: int = 3
    """Sink states away from position 0 analysed per BOS setting, strongest first (0: none)."""
    neurons_keep: int = 32
    """Neurons confirmed by exact patching per onset (the strongest integrated-gradient estimates)."""
    ig_steps: int = 4
    """Integrated-gradient points per MLP in the neuron screen."""
    exact_nodes: int = 200
    """Candidate nodes above which an onset is screened by attribution patching first (0: never). A screened
    onset ranks every candidate by attribution patching and patches exactly the strongest estimates and a random
    sample (:func:`~p0circuit.studies.analysis.steps.screened`); the rest report no effect. The circuit search is
    exact either way and corrupts every candidate outside its circuit. An exact pass grows with the square of the
    onset's depth, a screened one linearly: at 200, SmolLM2's block-11 onset (240 candidates) is screened, every
    onset of Gemma 3 and Qwen2.5 (at most 182) is not; docs/performance.md gives the screen's measured recall."""
    max_edges: int = 128
    """Candidate edges of a faithful circuit up to which its edges are pruned as a set (each evaluation is a
    forward up to the onset); above it they are measured one by one only, and the record says so."""
    lengths: tuple[int, ...] = (12, 48)
    """Other prompt lengths compared at the first onset."""
    seed: int = 0
    """Seed of the prompts and of the random corruptions."""
    first_tokens: int = 65536
    """Vocabulary tokens run as first tokens at the first P0 onset of each BOS setting: the whole vocabulary when it
    holds no more, else at most this many drawn at random (0: every token). The special tokens and the prompts' first
    tokens are always among them; ``first_tokens_margin`` says when the drawing stops sooner."""
    first_tokens_margin: float = 0.005
    """Half-width, a fraction in [0, 0.5), of the 95% interval of the share of sink-making first tokens at which a
    sampled first-token map stops drawing (rounds of 1024 tokens; 0: draw all of --first-tokens). A map costs its onset's depth per token, and
    a share near 0 or 1 is settled by the first round: a random-weight 1.24B Llama with a planted sink spent 67 of its
    222 counted forwards on 65,536 draws. A share near a half takes about 38,000 draws at 0.005
    (docs/performance.md)."""
    later_first_tokens: int = 8192
    """Vocabulary tokens run as first tokens at a later P0 onset (``--max-onsets 2``), drawn the same way, at most
    ``first_tokens``; the share that becomes a sink state is then given with its 95% interval (0: as ``first_tokens``).
    A map costs its onset's depth per token: SmolLM2's block-11 map runs 12 blocks per token against 3 at block 2, and
    of every token it was the longest single step of a two-onset analysis (docs/performance.md)."""
    spread_prompts: int = 64
    """Prompts the first P0 onset's headline numbers are measured again on, with 95% bootstrap intervals and per-prompt
    minima (drawn with seed + 1; 0: not measured)."""

    def __post_init__(self) -> None:
        for name in ("n_prompts", "length", "max_onsets", "max_sinks", "neurons_keep", "ig_steps", "exact_nodes", "max_edges",
                     "seed", "spread_prompts", "first_tokens", "later_first_tokens"):
            value = getattr(self, name)
            low = 0 if name in ("seed", "exact_nodes", "max_sinks", "first_tokens", "later_first_tokens") else \
                (2 if name in ("n_prompts", "length") else 1)
            if name == "spread_prompts":
                if value == 0:
                    continue
                low = 8  # an interval over fewer prompts says little
            high = math.inf if name == "seed" else MAX_COUNT  # (a seed's own bound follows, with its reason)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"analysis setting {_named(name)} must be a whole number >= {low}"
                                  + (" (or 0: not measured)" if name == "spread_prompts" else "")
                                  + f" (at most {high:.0e})" * (isinstance(value, int) and value > high)
                                  + f", got {value!r:.40}")
        if self.seed > 2**32 - 1:
            raise ConfigError(f"analysis setting {_named('seed')} must be a whole number in 0..{2**32 - 1} (what the "
                              f"prompt and corruption generators take), got {self.seed!r:.40}")
        if self.ig_steps > MAX_IG_STEPS:
            raise ConfigError(f"analysis setting ig_steps (--ig-steps) is {self.ig_steps}, more than {MAX_IG_STEPS}: each "
                              "point costs a forward and backward per MLP screened (up to four), and the default, 4, "
                              f"is checked against exact patching in docs/guide.md; pass a number in 1-{MAX_IG_STEPS}")
        margin = self.first_tokens_margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 0.5:
            raise ConfigError(f"analysis setting {_named('first_tokens_margin')} must be a number in [0, 0.5) (the "
                              "half-width of the share's 95% interval at which a sampled first-token map stops "
                              f"drawing; 0: draw all first_tokens), got {margin!r:.40}")
        for name in ("bos", "lengths"):
            if not isinstance(getattr(self, name), (list, tuple)):
                raise ConfigError(f"analysis setting {name} must be a list or tuple, got {getattr(self, name)!r:.40}")
        object.__setattr__(self, "bos", tuple(self.bos))
        object.__setattr__(self, "lengths", tuple(self.lengths))
        if not self.bos or any(not isinstance(b, bool) for b in self.bos) or len(set(self.bos)) != len(self.bos):
            raise ConfigError(f"analysis setting bos must list False and/or True once each, got {self.bos!r}")
        if any(isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= MAX_COUNT for n in self.lengths):
            raise ConfigError(f"analysis setting lengths must be whole numbers >= 2, got {self.lengths!r:.60}")
        for name, low, high, meaning in (
                ("threshold", 0, 1, "the |normalized effect| at which a component is kept: 1 is the whole change, so a "
                                    "line at or above it keeps only components that overshoot it alone"),
                ("norm_threshold", 1, math.inf, f"the norm ratio at which a position counts as a sink state: {RATIO_LINE}")):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or not low < value < high):
                bound = f"> {low}" if high == math.inf else f"in ({low}, {high})"
                raise ConfigError(f"analysis setting {_named(name)} must be a finite number {bound} ({meaning}), "
                                  f"got {value!r:.40}")


def check_bos_token(bos_token: object, settings: AnalysisSettings) -> None:
    """Refuse a start token given for an analysis that measures no with-BOS setting (it would be ignored)."""
    if bos_token is not None and True not in settings.bos:
        raise ConfigError(f"bos_token (--bos-token) {bos_token!r} is the token the with-BOS setting puts first, but "
                          f"bos={settings.bos} (--bos without) measures no with-BOS setting: measure it too (--bos both "
                          "or --bos with; bos=(False, True)), or leave the token out")


def read_state(path: Path) -> StateFile:
    """The state file's content, or a clear error for a damaged one or one of another schema version
    (:mod:`.records`: no version, or an older or newer one, is refused with what to do)."""
    return StateFile.read(path)


def precheck(out: Optional[Path], label: str, settings: AnalysisSettings, resume: bool) -> None:
    """Refuse, before any model is loaded, a directory that holds an analysis of another model, other
    settings or another schema version (``resume=False`` replaces it instead)."""
    path = None if out is None else out / STATE
    if path is None or not path.is_file() or not resume:
        return
    old = read_state(path).header
    mine = json.loads(json.dumps(asdict(settings)))
    if old.model != label or old.settings != mine:
        diff = sorted(k for k in mine if old.settings.get(k) != mine[k])
        raise ConfigError(f"{out} holds an analysis of {old.model!r}"
                          + (" with other settings (" + ", ".join(f"{_named(k)}: {old.settings.get(k)!r} there, "
                                                               f"{mine[k]!r} now" for k in diff) + ")" if diff else "")
                          + "; write to another directory, or pass --fresh (fresh=True in Python) to replace it")
