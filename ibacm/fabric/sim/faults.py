"""Fault settings of a simulated fabric and the per-MAD decisions they lead to.

``Faults`` is the mutable settings object of a world (``world.faults.loss = 0.1``); every
assignment is checked, so a typo or an out-of-range probability fails at once with a clear
message instead of silently simulating nonsense. ``FaultInjector`` draws the decisions for one
transmission from the world's seeded random generator, so a run is reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any

_PROBABILITIES = ("loss", "duplicate", "corrupt", "sa_busy")
_DURATIONS = ("delay", "sa_service_time")


class FaultSettingError(ValueError):
    """A fault setting has an unknown name or a value out of range."""


@dataclass
class Faults:
    """What goes wrong on the fabric; every field may be changed at any time.

    Probabilities apply to each MAD transmission (unicast, each multicast copy, each SA
    request, response and RMPP segment): ``loss`` drops it, ``duplicate`` delivers it twice,
    ``corrupt`` flips one byte. ``delay`` adds seconds to every delivery. ``sa_busy`` is the
    probability that the SA answers with MAD status BUSY; ``sa_down`` makes it answer nothing.
    ``sa_service_time`` is the SA's time per request (requests queue behind each other), and
    more than ``sa_queue_limit`` waiting requests are answered BUSY at once.
    """

    loss: float = 0.0
    duplicate: float = 0.0
    corrupt: float = 0.0
    delay: float = 0.0
    sa_busy: float = 0.0
    sa_down: bool = False
    sa_service_time: float = 0.0002
    sa_queue_limit: int = 1024

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, _checked(name, value))

    def set(self, name: str, text: str) -> None:
        """Set a field from text (the ``ibacm-sim fault`` command): ``loss 0.1``, ``sa_down on``."""
        if name not in {f.name for f in fields(self)}:
            known = ", ".join(f.name for f in fields(self))
            raise FaultSettingError(f"unknown fault {name!r}; known: {known}")
        value: Any
        try:
            if name == "sa_down":
                value = _parse_bool(text)
            elif name == "sa_queue_limit":
                value = int(text, 0)
            else:
                value = float(text)
        except ValueError as exc:
            raise FaultSettingError(f"{name}: cannot use {text!r}: {exc}") from exc
        setattr(self, name, value)

    @property
    def alters_transmissions(self) -> bool:
        """Whether a transmission may be lost, duplicated or corrupted."""
        return bool(self.loss or self.duplicate or self.corrupt)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "on", "yes", "true"):
        return True
    if lowered in ("0", "off", "no", "false"):
        return False
    raise ValueError("expected on/off")


def _checked(name: str, value: Any) -> Any:
    if name in _PROBABILITIES or name in _DURATIONS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FaultSettingError(f"{name} must be a number, got {value!r}")
        value = float(value)
        if value != value or value < 0:  # NaN or negative
            raise FaultSettingError(f"{name} must be >= 0, got {value}")
        if name in _PROBABILITIES and value > 1:
            raise FaultSettingError(f"{name} is a probability (0..1), got {value}")
    elif name == "sa_down":
        if not isinstance(value, bool):
            raise FaultSettingError(f"sa_down must be True or False, got {value!r}")
    elif name == "sa_queue_limit" and (
        isinstance(value, bool) or not isinstance(value, int) or value < 1
    ):
        raise FaultSettingError(f"sa_queue_limit must be an integer >= 1, got {value!r}")
    return value


class FaultInjector:
    """Draws the fate of each transmission from one seeded generator."""

    def __init__(self, faults: Faults, rng: random.Random) -> None:
        self.faults = faults
        self.rng = rng

    def copies(self, mad: bytes) -> tuple[list[bytes], str | None]:
        """The copies of ``mad`` that arrive (0, 1 or 2), and what happened to them, if anything.

        The outcome is ``"lost"``, ``"duplicated"``, ``"corrupted"`` or None; a duplicated
        MAD may also be corrupted (each copy is judged on its own).
        """
        faults = self.faults
        rng = self.rng
        if faults.loss and rng.random() < faults.loss:
            return [], "lost"
        outcome: str | None = None
        count = 1
        if faults.duplicate and rng.random() < faults.duplicate:
            count, outcome = 2, "duplicated"
        result = []
        for _ in range(count):
            if faults.corrupt and rng.random() < faults.corrupt:
                result.append(self.corrupted(mad))
                outcome = "corrupted" if outcome is None else outcome
            else:
                result.append(mad)
        return result, outcome

    def corrupted(self, mad: bytes) -> bytes:
        """``mad`` with one byte flipped (never a no-op)."""
        data = bytearray(mad)
        if data:
            data[self.rng.randrange(len(data))] ^= self.rng.randrange(1, 256)
        return bytes(data)

    def busy(self) -> bool:
        return bool(self.faults.sa_busy) and self.rng.random() < self.faults.sa_busy
