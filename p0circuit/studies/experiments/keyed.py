"""Keyed on what: is a sink state made by its *position*, its *token*, or the *context* before it?

A high-norm state at some position can be built three ways. A model may recognise the position
itself (position 0 has nothing before it: the P0 circuit of Peng et al. 2026), the token that
stands there (a BOS token, or an ordinary token that a middle-layer MLP turns into a *secondary
sink*: "On the Existence and Behavior of Secondary Attention Sinks", ICLR 2026), or what comes
before it (the first comma after a clause). Patching one corruption cannot tell these apart: the
token swap removes a token-keyed state and a context-keyed one alike. :func:`keyed_on` separates
them with three edits of prompts in which the state sits at one index ``at`` in every prompt, and
reads the state's *position norm ratio* (its residual norm over its prompt's median norm, after
block ``layer``) in each:

* **swapped**: the token at ``at`` replaced in place by a token drawn from the other positions of
  the prompts (position and context kept);
* **moved**: ``MOVE`` tokens of another prompt put in front (after a BOS token, which stays first,
  unless the state is the BOS token's own), so the token and everything before it move ``MOVE``
  places later; read at the token's new index (*follows*) and at the old index, which now holds
  another token (*stays*);
* **context replaced**: every position before ``at`` (a BOS token at 0 excepted) taken from another
  prompt, the token and its index kept (not defined at position 0, which has no context).

Each is a *kept share*, ``(ratio - 1) / (clean ratio - 1)`` prompt by prompt (an edit is compared with the same
prompt unedited: a mean over the batch would hide a state that moves from prompt to prompt with its context),
averaged over the prompts where ``at`` is a sink state: 1 keeps the whole excess norm, 0 none.
The verdict, with :data:`KEEPS` as the line: **position** when the state stays at its index with
another token there and does not follow the token; **token** when it follows the token, a swapped
token loses it, and another context keeps it; **context** when another context loses it and another
token keeps it; **token and context** when either edit loses it; otherwise **mixed**, with the numbers.
"""

import ast
import random
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from p0circuit.core import hooks
from p0circuit.core.errors import BadInputError
from p0circuit.core.args import entry_point
from p0circuit.core.defaults import NORM_THRESHOLD
from p0circuit.core.shares import share
from p0circuit.measures.positions import delimiter, position_ratios, token_text
from p0circuit.models.tokens import english_lines, prepend_id, probe_tokens

KEEPS = 0.5
"""Kept share of the clean state's excess norm at which an edit counts as keeping the state."""
MOVE = 3
"""Tokens put in front of the prompt by the *moved* edit."""
VERDICTS = ("position", "token", "context", "token and context", "mixed")
"""What a state can be keyed on (:func:`keyed_on`)."""


@dataclass(frozen=True)
class KeyedOn:
    """What :func:`keyed_on` measured (``to_dict`` is its JSON record)."""

    at: int
    """The state's index in the prompts."""
    layer: int
    """The block whose output is read."""
    prompts: int
    """Prompts in which position ``at`` is a sink state (those measured)."""
    clean: float
    """Mean position norm ratio of the state at ``at`` in those prompts."""
    swapped: float
    """Kept share with the token at ``at`` replaced in place."""
    follows: float
    """Kept share at the token's new index after :data:`MOVE` tokens were put in front."""
    stays: float
    """Kept share at the old index after that move (another token there)."""
    context: Optional[float]
    """Kept share with every position before ``at`` from another prompt (None at position 0)."""
    verdict: str
    """One of :data:`VERDICTS`."""
    evidence: str
    """The numbers, in words."""

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def sink_rows(model: Any, tokens: Tensor, at: int, layer: int, threshold: float = NORM_THRESHOLD) -> Tensor:
    """Which prompts of ``tokens`` hold a sink state at index ``at`` after block ``layer`` (position norm ratio at
    least ``threshold``): a boolean per prompt, from one forward up to ``layer``."""
    (ratio,) = _ratios(model, tokens, layer, torch.full((tokens.shape[0],), at))
    return ratio >= threshold


def _ratios(model: Any, tokens: Tensor, layer: int, *indices: Tensor) -> list[Tensor]:
    """Per prompt, the position norm ratio after block ``layer`` at each of ``indices`` (one index per prompt each),
    from one forward."""
    name = hooks.resid_post(layer)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == name, stop_at_layer=layer + 1)
    ratios = position_ratios(cache[name][None])[0]  # (B, T)
    rows = torch.arange(tokens.shape[0])
    return [ratios[rows, at].double() for at in indices]


def verdict_of(swapped: float, follows: float, stays: float, context: Optional[float]) -> str:
    """The verdict from the four kept shares (see the module docstring)."""
    keeps = lambda v: v is not None and v >= KEEPS  # noqa: E731
    if keeps(stays) and not keeps(follows) and keeps(swapped):
        return "position"
    if keeps(follows) and not keeps(swapped) and (context is None or keeps(context)):
        return "token"
    if context is not None and not keeps(context) and keeps(swapped):
        return "context"
    if context is not None and not keeps(context) and not keeps(swapped):
        return "token and context"
    return "mixed"


@entry_point
def keyed_on(model: Any, tokens: Tensor, at: int, layer: int, *, bos: bool, seed: int = 0,
             threshold: float = NORM_THRESHOLD) -> KeyedOn:
    """Whether the sink state at index ``at`` of the prompts ``tokens`` (after block ``layer``) is keyed on its
    position, its token or the context before it (the module docstring says how), judged on the prompts where it
    is a sink state (position norm ratio at least ``threshold``; at least 2 needed). ``bos``: whether the prompts
    start with a BOS token (it stays at position 0 when the context is replaced). Four forwards up to ``layer``."""
    batch, seq = tokens.shape
    if batch < 2:
        raise BadInputError("keyed_on takes the moved and replaced tokens from other prompts: pass at least 2 prompts")
    if not (isinstance(at, int) and 0 <= at < seq - 1):
        raise BadInputError(f"keyed_on: at={at!r} must index a position before the prompts' last ({seq - 1})")
    if not (isinstance(layer, int) and 0 <= layer < model.cfg.n_layers):
        raise BadInputError(f"keyed_on: layer={layer!r} is not a block of this model (0..{model.cfg.n_layers - 1})")
    if at + MOVE >= model.cfg.n_ctx:
        raise BadInputError(f"keyed_on moves the token {MOVE} places later: at={at} needs a context of more than "
                            f"{at + MOVE} positions, and this model's is {model.cfg.n_ctx}")
    here = torch.full((batch,), at)
    (clean,) = _ratios(model, tokens, layer, here)
    sink = clean >= threshold
    if int(sink.sum()) < 2:
        raise BadInputError(f"keyed_on: position {at} is a sink state (position norm ratio >= {threshold:g}) after block "
                            f"{layer} in {int(sink.sum())} of {batch} prompts (ratios "
                            f"{[round(float(c), 2) for c in clean]}); at least 2 are needed")
    other = tokens.roll(1, dims=0)  # another prompt for each prompt (its values are compared prompt by prompt)

    def kept(value: Tensor) -> float:
        """Mean over the prompts holding the state of (ratio - 1) / (clean ratio - 1)."""
        return float(((value - 1) / (clean - 1))[sink].mean())

    pool = [int(t) for t in tokens[:, 1:].flatten().tolist()]
    pick = random.Random(seed)
    swapped_tokens = tokens.clone()
    for b in range(batch):
        choices = [t for t in pool if t != int(tokens[b, at])] or [int(tokens[b, at]) ^ 1]
        swapped_tokens[b, at] = pick.choice(choices)
    swapped = kept(*_ratios(model, swapped_tokens, layer, here))

    # the tokens go in after a BOS token (it stays first, as the context edit keeps it), unless the state is the BOS's
    cut = 1 if bos and at > 0 else 0
    moved_tokens = torch.cat([tokens[:, :cut], other[:, 1:1 + MOVE], tokens[:, cut:]], dim=1)[:, :model.cfg.n_ctx]
    follows, stays = (kept(r) for r in _ratios(model, moved_tokens, layer, here + MOVE, here))

    context = None
    start = 1 if bos else 0
    if at > start:
        ctx_tokens = tokens.clone()
        ctx_tokens[:, start:at] = other[:, start:at]
        context = kept(*_ratios(model, ctx_tokens, layer, here))

    verdict = verdict_of(swapped, follows, stays, context)
    n = int(sink.sum())
    evidence = (f"after block {layer}, in the {n} of {batch} prompts where position {at} is a sink state (position "
                f"norm ratio, its norm over the prompt's median norm, {float(clean[sink].mean()):.3g} there, at least "
                f"{threshold:g}), the state keeps {share(swapped)} of its excess norm with its token replaced in place, "
                f"{share(follows)} at the token's new place when {MOVE} tokens are put in front of it"
                + (" (after the BOS token)" if cut else "") + f" (and {share(stays)} at the old place, another token "
                "there)" + ("" if context is None else f", and {share(context)} with the context before it from another "
                "prompt") + f" (a share of {KEEPS:g} or more counts as kept)")
    return KeyedOn(at=at, layer=layer, prompts=n, clean=float(clean[sink].mean()), swapped=swapped, follows=follows,
                   stays=stays, context=context, verdict=verdict, evidence=evidence)

def target_of(where: str, tokens: tuple = ()) -> Optional[tuple[str, str]]:
    """A sink class of the sink report (``where``, with its commonest ``tokens``) as what :func:`aligned_prompts`
    looks for: ``("first", ",")``, ``("later", ",")`` or ``("token", " the")``; None for P0 and a later BOS."""
    if where.startswith(("first ", "later ")):
        kind, quoted = where.split(" ", 1)
        return kind, ast.literal_eval(quoted)  # the class names its delimiter as repr() writes it
    if where == "other" and tokens:
        return "token", tokens[0][0]
    return None


def _matches(kind: str, value: str, texts: list[str], i: int, start: int) -> bool:
    """Whether the token at ``i`` of a window beginning at ``start`` is the class (``texts``: the stream's tokens)."""
    if kind == "token":
        return texts[i] == value
    if delimiter(texts[i]) != value:
        return False
    earlier = any(delimiter(texts[j]) == value for j in range(start, i))
    return earlier if kind == "later" else not earlier


@entry_point
def aligned_prompts(model: Any, target: tuple[str, str], n: int, length: int, at: int, *, bos: bool,
                    seed: int = 0) -> Tensor:
    """Up to ``n`` prompts of ``length`` tokens (a BOS token first when ``bos``) in which the sink class ``target``
    (:func:`target_of`) stands at index ``at``: windows of the shipped English passages, run together, that put an
    occurrence there (distinct windows, picked in an order shuffled by ``seed``). A model without a tokenizer
    (a planted one) gets random regular prompts with token ``#id`` put at ``at`` and nowhere else."""
    kind, value = target
    text = length - int(bos)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BadInputError(f"aligned_prompts: n must be a whole number >= 1, got {n!r}")
    if length > model.cfg.n_ctx:
        raise BadInputError(f"aligned_prompts: length {length} exceeds the model's context of {model.cfg.n_ctx} positions")
    if not 0 < at < length - 1:
        raise BadInputError(f"aligned_prompts: at={at} must lie inside the prompt, after position 0 and before its "
                            f"last ({length - 1})")
    if getattr(model, "tokenizer", None) is None:
        if kind != "token" or not value.startswith("#"):
            raise BadInputError(f"aligned_prompts: a model without a tokenizer knows tokens as '#id', not {target!r}")
        want = int(value[1:])
        toks = probe_tokens(model, n, text, seed=seed, regular=True)
        toks[toks == want] = (want + 1) % model.cfg.d_vocab
        toks[:, at - int(bos)] = want
        if bos:
            toks = torch.cat([torch.full((n, 1), prepend_id(model), dtype=toks.dtype), toks], 1)
        return toks
    ids = list(model.tokenizer(" ".join(english_lines()), add_special_tokens=False)["input_ids"])
    read = token_text(model)
    texts = [read(i) for i in ids]
    offset = at - int(bos)  # the target's index among the text tokens
    starts = [i - offset for i in range(offset, len(ids) - (text - offset))
              if _matches(kind, value, texts, i, i - offset + (0 if bos else 1))]
    random.Random(seed).shuffle(starts)
    chosen: list[int] = []
    for s in starts:  # windows that do not overlap
        if all(abs(s - c) >= text for c in chosen):
            chosen.append(s)
        if len(chosen) == n:
            break
    if len(chosen) < 2:
        raise BadInputError(f"aligned_prompts: the shipped passages hold {len(chosen)} window(s) of {length} tokens with "
                            f"{kind} {value!r} at index {at}; at least 2 are needed")
    rows = [ids[s:s + text] for s in sorted(chosen)]
    if bos:
        rows = [[prepend_id(model)] + r for r in rows]
    return torch.tensor(rows, dtype=torch.long, device=model.cfg.device)
