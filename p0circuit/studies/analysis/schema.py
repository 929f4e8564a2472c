"""The analysis records' version, their base class and the BOS settings' keys: the facts every record module of
``analysis.json`` shares (:mod:`.records`, :mod:`.passes`, :mod:`.summaries`). Imports no torch."""

from typing import ClassVar, Optional

from p0circuit.core.record import Record

SCHEMA_VERSION = 5
"""The version of ``analysis.json`` and ``analysis.state.json`` this p0circuit writes, and the only one it reads.
Bump it when a key of a record (or of a step's value in the state) is added, removed, renamed or changes
meaning (docs/contributing.md)."""

SETTINGS = {False: "without_bos", True: "with_bos"}
"""BOS setting -> its key in the results."""
TITLES = {"without_bos": "without BOS", "with_bos": "with BOS"}
"""A BOS setting's key -> its name in the written pages."""


class AnalysisPart(Record):
    """A record of ``analysis.json`` (or of a step's value in its state): its keys are its fields, in the module that
    defines it."""

    SCHEMA_VERSION: ClassVar[Optional[int]] = SCHEMA_VERSION

    @classmethod
    def _fix(cls) -> str:
        path = cls.__module__.replace(".", "/") + ".py"
        return cls.FIX or (f"a record's keys are its fields in {path} ({cls.__name__}; docs/records.md); a new key is "
                           "added there, with SCHEMA_VERSION bumped (docs/contributing.md)")
