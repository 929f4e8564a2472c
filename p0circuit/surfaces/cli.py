"""Command line: ``p0circuit analyze``, ``p0circuit discover``, ``p0circuit survey`` and ``p0circuit sweep CONFIG``, ``p0circuit report DIR``, ``p0circuit train``, ``p0circuit track DIR``.

``p0circuit discover`` with no arguments builds the planted RoPE model, measures its sink,
discovers the circuit with activation patching and path patching under the ``shift``
corruption, compares both with the planted ground truth, and writes the circuits (JSON, DOT and,
when Graphviz is installed, SVG), their figures and heatmaps, and the report under
``runs/discover/planted-rope/shift-default/`` (one directory per model entry and settings; a run of
another model or other settings there is refused unless ``--force``).
"""

# The subcommands import their modules inside their functions so that argument errors and --help
# need no more than the registries imported below.
import argparse
import re
import json
import os
import shutil
import signal
import sys
import warnings
from pathlib import Path
from typing import NoReturn, Optional, Sequence


from p0circuit.core.defaults import CIRCUIT_THRESHOLD, EDGE_BUDGET, NODE_BUDGET
from p0circuit.core import choices
from p0circuit.core.names import POSITIONS
from p0circuit.core.io import run_dir
from p0circuit.studies.analysis.settings import number_fields  # (no torch: its own module says so)
from p0circuit.core.entries import ATLAS_MODELS, FROM_FILES, PROMPT_SOURCES, SPEC_FAMILIES, VARIANTS, metric_entries


def _model_entry(args: argparse.Namespace) -> str:
    if args.model:
        return args.model
    if args.checkpoint:
        return f"checkpoint:{args.checkpoint}"
    if args.spec:
        return f"spec:{args.spec}"
    return f"planted:{args.plant}"


def _layers(text: str, n_layers: Optional[int]) -> list[int]:
    """``"0-3"``, ``"0,2,5"`` or ``"4"`` as a list of layers of the model (``n_layers`` None: the model's size is not
    known yet, so only the spelling is checked)."""
    from p0circuit.core.errors import ConfigError

    spelled = "use a range like 0-3 or a list like 0,2,5 (ASCII digits)"
    parts = [part.split("-") for part in text.split(",")]
    if not text or any(len(p) > 2 or not all(x.isascii() and x.isdigit() for x in p) for p in parts):
        raise ConfigError(f"--layers {text!r}: {spelled}")
    backwards = [f"{p[0]}-{p[1]}" for p in parts if len(p) == 2 and int(p[0]) > int(p[1])]
    if backwards:
        raise ConfigError(f"--layers {text!r}: the range {backwards[0]} runs backwards; write it low to high "
                          f"({backwards[0].split('-')[1]}-{backwards[0].split('-')[0]})")
    layers = sorted({l for p in parts for l in (range(int(p[0]), int(p[1]) + 1) if len(p) == 2 else [int(p[0])])})
    if n_layers is not None and layers[-1] >= n_layers:
        raise ConfigError(f"--layers {text!r}: the model has layers 0..{n_layers - 1}")
    return layers


OWNER = "run.json"
"""The file a ``discover`` directory names its model entry in."""


def _run_settings(args: argparse.Namespace) -> dict:
    """What makes one discovery differ from another in the same model (the run marker records it)."""
    return {"model": _model_entry(args), "methods": sorted(args.methods), "corruption": args.corruption,
            "metric": args.metric or "default", "bos": bool(args.bos), "positions": args.positions,
            "layers": args.layers, "nodes": args.nodes, "threshold": args.threshold, "prompts": args.prompts,
            "text": args.text, "n_prompts": args.n_prompts, "seq_len": args.seq_len, "seed": args.seed}


def _default_out(args: argparse.Namespace) -> Path:
    """``runs/discover/<entry>/<corruption>-<metric>[-bos][-each]``: one directory per model and settings."""
    tags = [args.corruption, args.metric or "default"] + (["bos"] if args.bos else []) + (
        ["each"] if args.positions == "each" else [])
    return run_dir("discover", _model_entry(args), *tags)


def _check_owner(out: Path, settings: dict, force: bool) -> None:
    """Refuse to write a discovery over a directory holding a run of another model or other settings."""
    from p0circuit.core.errors import ConfigError

    marker = out / OWNER
    if marker.is_file() and not force:
        try:
            held = json.loads(marker.read_text())
        except ValueError:
            held = {}
        held = held if isinstance(held, dict) else {}
        if held.get("model") != settings["model"]:
            raise ConfigError(f"--out {out} holds a discovery of {held.get('model')!r}; choose another --out, or pass "
                              "--force to write this one over it")
        differ = sorted(k for k in settings if k in held and held[k] != settings[k])
        if differ:
            raise ConfigError(f"--out {out} holds a discovery of {settings['model']!r} with other settings "
                              f"({', '.join(f'{k}={held[k]!r}' for k in differ)}); choose another --out, or pass "
                              "--force to write this one over it")


def _check_before_loading(args: argparse.Namespace) -> None:
    """Every check that needs no model, and those that need only its number of blocks (known without
    loading for planted, spec and Hugging Face directory entries), before the model is built."""
    from p0circuit.core.entries import check_metric_entry, entry_layers
    from p0circuit.core.errors import ConfigError
    from p0circuit.core.types import parse_nodes

    for option, least in (("n_prompts", 1), ("seq_len", 2)):  # (None: the default that fits the model)
        value = getattr(args, option, None)
        if value is not None and value < least:
            raise ConfigError(f"--{option.replace('_', '-')} {value}: must be a whole number >= {least}")
    n_layers = entry_layers(_model_entry(args))
    if args.metric:
        check_metric_entry(args.metric, n_layers)
    if args.layers:
        _layers(args.layers, n_layers)
    if args.nodes and args.positions == "each":
        raise ConfigError("--positions each makes every position of every component a candidate; pass it or --nodes, "
                          "not both (--layers narrows either)")
    if args.nodes:
        nodes = parse_nodes(args.nodes)
        late = [n.name for n in nodes if n_layers is not None and n.layer >= n_layers]
        if late:
            raise ConfigError(f"--nodes {' '.join(late[:3])}: the model has blocks 0..{n_layers - 1}")
    _check_owner(Path(args.out), args.settings, args.force)  # the input's own errors first, then what --out holds


def _discover(args: argparse.Namespace) -> int:
    args.settings = _run_settings(args)  # as given, before the defaults that depend on the model
    _check_before_loading(args)  # before torch is imported: a mistyped name is refused in well under a second
    from p0circuit.studies.discovery.session import run_discovery
    from p0circuit.surfaces.discovery_files import write_discovery
    from p0circuit.models.resolve import load_model
    from p0circuit.patching import candidate_nodes
    from p0circuit.patching.sites import position_candidates
    from p0circuit.patching.metrics import metric_from_entry
    from p0circuit.core.types import parse_nodes
    from p0circuit.models.tokens import bos_label, make_prompts, set_bos, text_windows

    resolved = load_model(_model_entry(args), seed=args.seed)
    model = resolved.model
    large = sum(p.numel() for p in model.parameters()) > 50_000_000  # a real-size model: a smaller default batch
    if args.n_prompts is None:
        args.n_prompts = 8 if large else 32
    if args.seq_len is None:
        args.seq_len = 24 if large else 32
    if args.bos_token is not None:
        set_bos(model, int(args.bos_token) if args.bos_token.isdigit() else args.bos_token)
    elif args.bos and resolved.start_token is not None:  # the entry's start token, as analyze prepends it
        set_bos(model, resolved.start_token)
    if args.text:
        tokens = text_windows(model, Path(args.text).read_text(encoding="utf-8"), args.n_prompts, args.seq_len,
                              prepend_bos=args.bos)
        what = f"{tokens.shape[0]} windows of {args.text} x {tokens.shape[1]} tokens"
    else:
        prompts = make_prompts(model, args.n_prompts, args.seq_len, source=args.prompts, seed=args.seed, bos=args.bos)
        tokens, what = prompts.tokens, prompts.describe()
    metric = metric_from_entry(args.metric, model, resolved.sink_heads) if args.metric else None
    nodes = position_candidates(model, args.positions, tokens.shape[1], parse_nodes(args.nodes) if args.nodes else None)
    if args.layers:
        layers = _layers(args.layers, model.cfg.n_layers)
        nodes = [n for n in (nodes or candidate_nodes(model)) if n.layer in layers]
    print(f"p0circuit discover: {resolved.label}, {what}, {bos_label(model) if args.bos else 'no BOS'}")
    found = run_discovery(resolved, tokens, methods=args.methods, corruption=args.corruption, metric=metric,
                          threshold=args.threshold, bos=args.bos, nodes=nodes, edge_budget=args.edge_budget,
                          node_budget=args.node_budget, progress=not args.quiet)
    print(found)
    out = write_discovery(found, args.out)
    (out / OWNER).write_text(json.dumps(args.settings))
    print(f"\nwrote {out}/")
    if shutil.which("dot") is None:
        from p0circuit.figures.graphs import GRAPHVIZ_MISSING  # already imported by the discovery above

        print(f"p0circuit: note: {GRAPHVIZ_MISSING}", file=sys.stderr)
    missed = found.inexact()
    if missed:  # a planted model: exit status 1 says the discovery did not recover the truth; so does this line
        print(f"p0circuit: the planted ground truth was not recovered exactly: {'; '.join(missed)}. The files are "
              f"written to {out}/; exit status 1 marks the mismatch (try other --corruption, --metric or --threshold "
              "settings, or more --n-prompts)", file=sys.stderr)
        return 1
    return 0


def _analyze(args: argparse.Namespace) -> int:
    from p0circuit.core.entries import check_model_entry
    from p0circuit.studies.analysis.settings import AnalysisSettings, check_bos_token, precheck

    # the entry, the settings and the directory before torch is imported, in well under a second
    kind, _ = check_model_entry(args.model)
    bos = {"both": (False, True), "without": (False,), "with": (True,)}[args.bos]
    given = {name: getattr(args, name) for name in number_fields() if getattr(args, name) is not None}
    settings = AnalysisSettings(bos=bos, **given)
    bos_token = int(args.bos_token) if args.bos_token and args.bos_token.isdigit() else args.bos_token
    check_bos_token(bos_token, settings)  # the options' own errors before any conflict with what --out holds
    out = Path(args.out)
    precheck(out, args.model, settings, resume=not args.fresh)
    if not args.quiet and kind in FROM_FILES:
        slow = kind == "real" or (kind == "checkpoint" and args.model.endswith(".gguf"))
        print(f"p0circuit: loading {args.model}" + (" (seconds from the conversion cache; a GGUF file's first load converts it: a minute or two)"
                                                   if slow else ""), file=sys.stderr)
    from p0circuit.core.clock import importing

    with importing():  # torch and TransformerLens come with it: the record's timing.import_s
        from p0circuit.studies.analysis.run import analyze
    result = analyze(args.model, out=out, bos_token=bos_token, resume=not args.fresh, progress=not args.quiet,
                     settings=settings)
    print(result)
    print(f"\nwrote {out}/analysis.md, analysis.json and report.html")
    return 0


def _atlas(args: argparse.Namespace) -> int:
    from p0circuit.studies.analysis.atlas import atlas

    text = atlas(args.models, out=args.page, runs=args.runs, progress=not args.quiet, fresh=args.fresh)
    print(text)
    print(f"wrote {args.page}")
    return 0


def _survey(args: argparse.Namespace) -> int:
    import pandas as pd

    from p0circuit.studies.experiments import default_models, survey
    from p0circuit.models.resolve import load_model

    models = {} if args.no_defaults else default_models(seed=args.seed)
    for kind, names in (("checkpoint", args.checkpoint or []), ("hub", args.hub or [])):
        for name in names:
            models[name] = (kind, load_model(f"{kind}:{name}").model)
    for entry in args.model or []:
        models[entry] = (entry.partition(":")[0], load_model(entry).model)
    frame = survey(models, n_prompts=args.n_prompts, seq_len=args.seq_len, seed=args.seed)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(frame)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "survey.csv")
    print(f"wrote {out / 'survey.csv'}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from p0circuit.surfaces.sweep.config import SweepConfig

    from p0circuit.surfaces.sweep.store import check_owner, done_keys, read_records

    config = SweepConfig.load(args.config)  # checked before torch is imported
    out = Path(args.out or Path("runs") / Path(args.config).stem)
    cells = config.cells()
    if args.dry_run:  # reads the directory only: no torch
        check_owner(config, out)
        done = done_keys(out)
        for cell in cells:
            print(f"{cell.key}  {'done' if cell.key in done else 'todo'}  {cell.label()}")
        print(f"{len(cells)} cells, {sum(c.key in done for c in cells)} already done in {out}")
        return 0
    from p0circuit.surfaces.sweep.runner import CellsFailed, run_sweep, summary_table

    try:
        records = run_sweep(config, out, workers=args.workers, max_cells=args.max_cells, progress=not args.quiet,
                            executor=args.executor)
    except CellsFailed as failed:  # the other cells finished: show them, then what failed; exit 1
        records = read_records(out)[0]
        print(summary_table(records))
        print(f"{len(records)} of {len(cells)} cells done; results in {out}/results.jsonl")
        print(f"p0circuit: {failed}", file=sys.stderr)
        return 1
    print(summary_table(records))
    print(f"{len(records)} of {len(cells)} cells done; results in {out}/results.jsonl")
    return 0


def _report(args: argparse.Namespace) -> int:
    from p0circuit.surfaces.sweep_report import write_report

    with warnings.catch_warnings(record=True) as caught:  # unreadable records: said, then skipped
        warnings.simplefilter("always")
        path = write_report(args.directory, attention=not args.no_attention)
    for w in caught:
        if str(w.message).startswith("report: "):
            print(f"p0circuit: note: {str(w.message)[len('report: '):]}", file=sys.stderr)
    print(f"wrote {path}")
    return 0


def _track(args: argparse.Namespace) -> int:
    from p0circuit.core.errors import BadInputError
    from p0circuit.models.tokens import avoid_ids, bos_id, make_prompts
    from p0circuit.studies.tracking import checkpoint_series, plot_tracking, track

    series = checkpoint_series(args.directory)
    smallest = min((m for _, m in series), key=lambda m: (m.cfg.d_vocab, m.cfg.n_ctx))
    ids = sorted({bos_id(m) for _, m in series} - {None})
    if args.bos and len(ids) != 1:
        raise BadInputError(f"--bos needs one known BOS id across the checkpoints, found {ids or 'none'}")
    length = min(args.seq_len, min(m.cfg.n_ctx for _, m in series))
    vocabs = {None if m.tokenizer is None else hash(frozenset(m.tokenizer.get_vocab().items())) for _, m in series}
    source = args.prompts
    if source in ("auto", "english") and (None in vocabs or len(vocabs) != 1):
        if source == "english":
            raise BadInputError("--prompts english needs every checkpoint to have the same tokenizer")
        source = "random"  # checkpoints without one shared tokenizer: random ids
    prompts = make_prompts(smallest, args.n_prompts, length, source=source, seed=args.seed, bos=args.bos)
    tokens = prompts.tokens
    if prompts.source != "english":
        avoid_ids(tokens[:, 1:] if args.bos else tokens, ids, smallest.cfg.d_vocab)  # no checkpoint's BOS id by chance
    print(f"p0circuit track: {len(series)} checkpoints, {prompts.describe()}")
    frame = track(series, tokens, bos=args.bos, locate=args.locate)
    print(frame.to_string())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "tracking.csv")
    plot_tracking(frame, out / "tracking.png")
    print(f"wrote {out / 'tracking.csv'} and {out / 'tracking.png'}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from p0circuit.models import ModelSpec
    from p0circuit.studies.training import BigramBackcopy, MarkovSource, TextSource, TrainConfig, train

    kind, _, arg = args.data.partition(":")
    if kind == "text":
        source = TextSource(arg, seed=args.seed, bos=256 if args.bos else None)
        vocab = source.vocab
    elif kind in ("markov", "backcopy"):
        vocab = args.vocab + (1 if args.bos else 0)
        bos = args.vocab if args.bos else None
        source = (MarkovSource(args.vocab, seed=args.seed, bos=bos) if kind == "markov"
                  else BigramBackcopy(args.vocab, seed=args.seed, bos=bos))
    else:
        from p0circuit.core.errors import ConfigError

        raise ConfigError(f"--data {args.data!r}: use 'markov', 'backcopy' or 'text:<path>'")
    spec = ModelSpec(n_layers=args.layers, d_model=args.d_model, n_heads=args.heads, d_head=args.d_head,
                     d_mlp=4 * args.d_model, d_vocab=vocab, n_ctx=max(args.seq_len, 64), pos=args.pos, seed=args.seed)
    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                         warmup=args.warmup, weight_decay=args.weight_decay, seed=args.seed,
                         n_checkpoints=args.checkpoints)
    train(spec, source, config, args.out, progress=not args.quiet)
    print(f"checkpoints in {args.out}/step_<N>/ (p0circuit track {args.out})")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose "invalid choice" and "unrecognized arguments" errors name the nearest valid one (a
    misspelled command or option: ``analyse`` -> ``analyze``, ``--modle`` -> ``--model``)."""

    def error(self, message: str) -> "NoReturn":  # type: ignore[override]
        import difflib
        import re

        near = ""
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            options = re.findall(r"'([^']*)'", choice.group(2))
            close = difflib.get_close_matches(choice.group(1), options, n=1)
            near = f"; did you mean {close[0]!r}?" if close else ""
        unknown = re.search(r"unrecognized arguments: (\S+)", message)
        if unknown and unknown.group(1).startswith("--"):
            flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
            for parser in (a.choices for a in self._actions if isinstance(a, argparse._SubParsersAction)):
                flags += [s for sub in parser.values() for a in sub._actions for s in a.option_strings]
            close = difflib.get_close_matches(unknown.group(1).split("=")[0], sorted(set(flags)), n=1)
            near = f"; did you mean {close[0]!r}?" if close else ""
        super().error(message + near)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to document the CLI)."""
    parser = _Parser(prog="p0circuit", description="Find, prove and track the P0-sink circuit of a "
                                     "causal language model. Start with `p0circuit analyze --model real:smollm2`; "
                                     "each command's --help says more.")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE (a module name or a .py file) first: the corruptions, metrics, methods "
                        "and model families it registers become choices everywhere (repeatable; see "
                        "p0circuit.core.plugins)")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="a fixed number of CPU threads for torch (default: OMP_NUM_THREADS if set, else one per "
                        "core, fewer while other processes keep the cores busy; docs/performance.md measures it)")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("discover", help="discover the P0-sink circuit (default: on the planted model)")
    d.add_argument("--plant", choices=sorted(VARIANTS), default="rope", help="planted variant (default rope)")
    d.add_argument("--model", help="any model entry: planted:<variant>, spec:<family>, checkpoint:<path>, "
                   "real:smollm2, real:gemma3, real:qwen2.5, hub:<name>")
    d.add_argument("--checkpoint", help="a local checkpoint instead of a plant: a Hugging Face directory, a "
                   "p0circuit training checkpoint (runs/train/step_N) or a .gguf file")
    d.add_argument("--spec", choices=sorted(SPEC_FAMILIES), help="a model family by name, freshly initialized")
    d.add_argument("--methods", nargs="+", default=["activation", "path"], choices=choices.offered("METHODS"))
    d.add_argument("--corruption", default="shift", choices=choices.offered("CORRUPTIONS"))
    d.add_argument("--metric", help=f"one of {metric_entries()} (default: sink_heads on a plant, else "
                   "norm_ratio at the layer where the P0 norm first passes 5x, else attn_to_p0)")
    d.add_argument("--layers", help="candidate nodes only in these layers, e.g. 0-3 or 0,2,5")
    d.add_argument("--nodes", nargs="+", help="candidate nodes by name, e.g. A0.H0@0 M1@0 M2@rest")
    d.add_argument("--positions", choices=POSITIONS, default="split",
                   help="candidate positions: split (P0 and the rest, default) or each (every position its own node)")
    d.add_argument("--edge-budget", type=int, default=EDGE_BUDGET,
                   help="most candidate edges path patching runs; above it, edges from an activation pass's nodes")
    d.add_argument("--node-budget", type=int, default=NODE_BUDGET,
                   help="most candidate nodes that can reach the metric (beyond it: an error saying how to narrow)")
    d.add_argument("--text", help="a UTF-8 text file: prompts are consecutive windows of it (needs a tokenizer)")
    d.add_argument("--prompts", default="auto", choices=PROMPT_SOURCES,
                   help="english: the shipped natural-English passages; random/regular: random token ids; "
                   "auto (default): english with a tokenizer, regular random ids without")
    d.add_argument("--bos", action="store_true", help="prompts start with the model's BOS token (default: no BOS)")
    d.add_argument("--bos-token", help="the token (string or id) --bos prepends, e.g. '<|endoftext|>' (needed when "
                   "the tokenizer's bos_token is not a start-of-text token, as with SmolLM2's <|im_start|>)")
    d.add_argument("--quiet", action="store_true", help="no progress bars")
    d.add_argument("--threshold", type=float, default=CIRCUIT_THRESHOLD)
    d.add_argument("--n-prompts", type=int, help="prompts (default 32; 8 for models over 50M parameters)")
    d.add_argument("--seq-len", type=int, help="tokens per prompt (default 32; 24 for models over 50M parameters)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--out", help="output directory (default runs/discover/<model entry>)")
    d.add_argument("--force", action="store_true", help="write into --out even when it holds another model's run")
    d.set_defaults(func=_discover)
    a = sub.add_parser("analyze", help="the paper's questions for one model: sinks, onsets, nodes, edges, neurons, "
                       "faithfulness, with and without BOS (resumable)")
    a.add_argument("--model", default="planted:rope", help="a model entry: planted:<variant>, spec:<family>, "
                   "checkpoint:<path>, real:smollm2, real:gemma3, real:qwen2.5, hub:<name> (default planted:rope)")
    a.add_argument("--out", help="output directory (default runs/analyze/<model entry>)")
    a.add_argument("--bos", default="both", choices=["both", "without", "with"],
                   help="BOS settings to measure (default both; 'with' is skipped, with the reason, for a model "
                   "without a start token)")
    a.add_argument("--bos-token", help="the start token of the with-BOS setting when the tokenizer's BOS is not one "
                   "(real:smollm2 uses <|endoftext|> by default)")
    fields = number_fields()
    for name, (default, doc) in fields.items():  # AnalysisSettings' own fields, defaults and words
        said = re.sub(r"``([^`]+)``", lambda m: "--" + m.group(1).replace("_", "-") if m.group(1) in fields else
                      m.group(1), doc)  # a setting's name as its option, other code as plain words
        a.add_argument("--" + name.replace("_", "-"), type=type(default), default=None,
                       help=f"{said[0].lower()}{said[1:]} (default {default})".replace("%", "%%"))
    a.add_argument("--fresh", action="store_true", help="start over instead of resuming what --out holds")
    a.add_argument("--quiet", action="store_true", help="no progress bar")
    a.set_defaults(func=_analyze)
    at = sub.add_parser("atlas", help="analyse several models and write their atlas page (docs/atlas.md)")
    at.add_argument("--models", nargs="+", default=list(ATLAS_MODELS), help="model entries (default: "
                    + ", ".join(ATLAS_MODELS) + ")")
    at.add_argument("--out", dest="page", default="docs/atlas.md", help="the page (default docs/atlas.md)")
    at.add_argument("--runs", default="runs/atlas", help="where each model's analysis goes (resumable; default "
                    "runs/atlas)")
    at.add_argument("--fresh", action="store_true", help="analyse every model again instead of resuming --runs")
    at.add_argument("--quiet", action="store_true", help="no progress bars")
    at.set_defaults(func=_atlas)
    s = sub.add_parser("survey", help="P0 sink and identification signal across architectures")
    s.add_argument("--model", nargs="*", help="model entries to add, e.g. real:smollm2 or 'spec:gated MLP (Llama)' (quoted: a family name holds spaces)")
    s.add_argument("--checkpoint", nargs="*", help="local checkpoints to add (Hugging Face directories, .gguf files)")
    s.add_argument("--hub", nargs="*", help="hub names to add (needs a hub or the HF cache), e.g. pythia-14m")
    s.add_argument("--no-defaults", action="store_true", help="skip the built-in tiny and planted models")
    s.add_argument("--n-prompts", type=int, default=16)
    s.add_argument("--seq-len", type=int, default=32)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default="runs/survey")
    s.set_defaults(func=_survey)
    w = sub.add_parser("sweep", help="run a patching sweep described in a TOML file (resumable)")
    w.add_argument("config", help="TOML file with a [sweep] table")
    w.add_argument("--out", help="results directory (default runs/<config name>)")
    w.add_argument("--dry-run", action="store_true", help="list the cells and whether they are done")
    w.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    w.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local processes (default) or Ray (a local cluster, or RAY_ADDRESS)")
    w.add_argument("--max-cells", type=int, help="stop after this many new cells")
    w.add_argument("--quiet", action="store_true", help="no progress bar")
    w.set_defaults(func=_sweep)
    r = sub.add_parser("report", help="write DIR/report.html for a sweep (self-contained, no network)")
    r.add_argument("directory", help="a sweep's results directory")
    r.add_argument("--no-attention", action="store_true", help="leave out the attention-pattern view")
    r.set_defaults(func=_report)
    t = sub.add_parser("track", help="stage of the P0 circuit across checkpoints in DIR/step_<N>/")
    t.add_argument("directory")
    t.add_argument("--n-prompts", type=int, default=16)
    t.add_argument("--seq-len", type=int, default=32)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--bos", action="store_true", help="probe prompts start with the checkpoints' BOS id (default: no BOS)")
    t.add_argument("--prompts", default="auto", choices=PROMPT_SOURCES,
                   help="auto (default): english when every checkpoint has the same tokenizer, else random ids")
    t.add_argument("--locate", default="auto", choices=["auto", "patching", "norm"],
                   help="locate the circuit by patching (auto: where affordable) or from the norm profile")
    t.add_argument("--out", default="runs/track")
    t.set_defaults(func=_track)
    tr = sub.add_parser("train", help="train a small model with log-spaced, resumable checkpoints")
    tr.add_argument("--data", default="backcopy", help="markov | backcopy | text:<path> (default backcopy)")
    tr.add_argument("--vocab", type=int, default=64, help="vocabulary of the synthetic sources")
    tr.add_argument("--bos", action="store_true", help="start every sequence with a BOS token (default: no BOS)")
    tr.add_argument("--pos", default="rope", choices=["rope", "nope", "learned"])
    tr.add_argument("--layers", type=int, default=3)
    tr.add_argument("--d-model", type=int, default=64)
    tr.add_argument("--heads", type=int, default=4)
    tr.add_argument("--d-head", type=int, default=16)
    tr.add_argument("--steps", type=int, default=1000)
    tr.add_argument("--batch-size", type=int, default=32)
    tr.add_argument("--seq-len", type=int, default=64)
    tr.add_argument("--lr", type=float, default=3e-3)
    tr.add_argument("--warmup", type=int, default=100)
    tr.add_argument("--weight-decay", type=float, default=0.1)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--checkpoints", type=int, default=12, help="number of log-spaced checkpoints (default 12)")
    tr.add_argument("--quiet", action="store_true")
    tr.add_argument("--out", default="runs/train")
    tr.set_defaults(func=_train)
    for command in sub.choices.values():  # --plugin is read from the whole command line (_load_plugins)
        command.add_argument("--plugin", action="append", default=[], metavar="MODULE", dest="plugin_after",
                             help="the same as --plugin before the subcommand")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``p0circuit`` command."""
    from p0circuit.core.errors import P0CircuitError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        _load_plugins(argv)  # before the parser is built: a plugin's names become its choices
    except P0CircuitError as e:
        print(f"p0circuit: error: {e}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(_global_first(argv, "--threads"))
    if args.threads is not None:
        from p0circuit.core.threads import set_threads

        try:
            set_threads(args.threads)
        except P0CircuitError as e:
            print(f"p0circuit: error: --threads: {e}", file=sys.stderr)
            return 2
    if args.command == "analyze" and args.out is None:
        args.out = str(run_dir("analyze", args.model))
    if args.command == "discover" and args.out is None:
        args.out = str(_default_out(args))
    previous = signal.signal(signal.SIGTERM, _terminated)
    made: list[Path] = []
    try:
        out = getattr(args, "out", None)
        if out is not None:
            made = _make_out(Path(out))
        return int(args.func(args))
    except P0CircuitError as e:
        print(f"p0circuit: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the file system refused: an output path that is a file, a read-only directory, a full disk
        where = f" {e.filename!r}" if getattr(e, "filename", None) else ""
        print(f"p0circuit: error: cannot use{where}: {e.strerror or e}; choose another path (e.g. --out) or fix its "
              "permissions", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"p0circuit: interrupted; {_what_is_kept(args)}", file=sys.stderr)
        return 130
    except Terminated:
        print(f"p0circuit: terminated (SIGTERM); {_what_is_kept(args)}", file=sys.stderr)
        return 143
    finally:
        _remove_empty(made)  # a run that wrote nothing leaves no empty output directories behind
        signal.signal(signal.SIGTERM, previous)


def _global_first(argv: list[str], flag: str) -> list[str]:
    """``argv`` with ``flag`` and its value moved before the subcommand, wherever the user wrote it
    (``p0circuit analyze --threads 1`` as ``p0circuit --threads 1 analyze``)."""
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return [a, argv[i + 1]] + argv[:i] + argv[i + 2:]
        if a.startswith(flag + "="):
            return [a] + argv[:i] + argv[i + 1:]
    return argv


RESUMABLE = {"analyze": "finished steps", "sweep": "finished cells", "train": "checkpoints"}
"""The commands that keep their work as it finishes, and what they keep."""


def _what_is_kept(args: argparse.Namespace) -> str:
    """What an interrupted command leaves behind, as it is on disk now."""
    out = getattr(args, "out", None)
    kept = RESUMABLE.get(args.command)
    if out is None:
        return f"the {kept} written so far are kept; run the same command to resume" if kept else "interrupted"
    files = [] if out is None or not Path(out).is_dir() else [p for p in Path(out).rglob("*") if p.is_file()]
    if kept is None:
        return "nothing more was written" if not files else f"what was written to {out} before it is kept"
    if not files:
        return f"nothing was saved yet (no {kept} in {out}); run the same command to start again"
    return f"the {kept} in {out} are kept; run the same command to resume"


def _load_plugins(argv: list[str]) -> None:
    """Import the ``--plugin`` modules named before the subcommand, and any installed plugins."""
    from p0circuit.core.plugins import installed

    named = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--plugin"]
    named += [a.split("=", 1)[1] for a in argv if a.startswith("--plugin=")]
    if named or installed():
        from p0circuit.core.plugins import load_installed, load_plugins

        load_installed()
        load_plugins(named)


def _make_out(out: Path) -> list[Path]:
    """Make the output directory before any work, so that a path that cannot be written (an
    existing file, a path under a file, a read-only directory) fails at once, not after the
    analysis. Returns the directories made (removed again if they stay empty)."""
    from p0circuit.core.errors import P0CircuitError

    if out.exists() and not out.is_dir():
        raise P0CircuitError(f"--out {str(out)!r} is an existing file, not a directory; choose another --out")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise P0CircuitError(f"--out {str(out)!r} lies under {str(parent)!r}, which is a file; choose another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise P0CircuitError(f"--out {str(out)!r}: {str(parent)!r} is not writable by this user; choose another --out "
                             "or fix its permissions")
    made = [p for p in [out, *out.parents] if not p.exists()]
    out.mkdir(parents=True, exist_ok=True)  # an OSError here (read-only file system) is one line, exit 2
    probe = out / ".p0circuit-write-test"
    probe.touch()
    probe.unlink()
    return made


def _remove_empty(made: list[Path]) -> None:
    for directory in made:  # deepest first
        try:
            directory.rmdir()
        except OSError:
            break


class Terminated(BaseException):
    """SIGTERM arrived: unwind (closing files and progress bars) and exit with a message. A
    ``BaseException``, like ``KeyboardInterrupt``: a sweep records a cell that raises an
    ``Exception`` as failed and goes on, but a termination must stop it."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated()


if __name__ == "__main__":
    sys.exit(main())
