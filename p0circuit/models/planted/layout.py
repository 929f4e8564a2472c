"""Where each planted feature lives in the residual stream.

Every feature of the planted model owns its own coordinates of the residual stream, so each
weight matrix can be read as "coordinate X feeds coordinate Y".
"""

from dataclasses import dataclass, field


@dataclass
class Layout:
    """Named blocks of residual-stream coordinates, allocated in order."""

    d_model: int = 0
    """Coordinates allocated so far (the model may be wider; extra coordinates stay zero)."""
    blocks: dict[str, range] = field(default_factory=dict)
    """Feature name -> its coordinates."""

    def add(self, name: str, size: int) -> range:
        """Allocate ``size`` fresh coordinates for feature ``name``."""
        if name in self.blocks:
            raise ValueError(f"layout block {name!r} allocated twice")
        r = range(self.d_model, self.d_model + size)
        self.blocks[name] = r
        self.d_model += size
        return r

    def __getitem__(self, name: str) -> range:
        return self.blocks[name]

    def one(self, name: str) -> int:
        """The single coordinate of a one-dimensional feature."""
        r = self.blocks[name]
        assert len(r) == 1, name
        return r.start
