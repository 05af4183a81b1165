"""The sampled pass's time slots of its held keys (:class:`kvbench.sim.shards.ShardsPass`)."""

from __future__ import annotations


class Slots:
    """Time slots of the held keys' latest accesses: one byte each (0: superseded or dropped, 1: a
    plain key, 2: a boosted one), counted with ``bytearray.count`` (C speed: the hot keys' slots are
    near the end). Renumbered (oldest first) when full, so memory follows the held keys, not the trace."""

    def __init__(self, size: int) -> None:
        self._classes = bytearray(size)
        self._size, self._next = size, 0

    def live_at_or_after(self, slot: int) -> tuple[int, int]:
        """Live (plain, boosted) accesses at slots ``>= slot``."""
        classes, end = self._classes, self._next
        return classes.count(1, slot, end), classes.count(2, slot, end)

    def remove(self, slot: int, boosted: int) -> None:
        self._classes[slot] = 0

    def append(self, boosted: int, held: dict[int, list]) -> int:
        """The next slot, for a key of ``held`` whose slot is ``None`` now (renumbers ``held``'s
        slots first when full)."""
        if self._next == self._size:
            self._renumber(held)
        slot, self._next = self._next, self._next + 1
        self._classes[slot] = 1 + boosted
        return slot

    def _renumber(self, held: dict[int, list]) -> None:
        live = sorted((entry[0], h) for h, entry in held.items() if entry[0] is not None)
        self._size = max(self._size, 2 * len(live) + 2)
        self._classes = bytearray(self._size)
        for slot, (_, h) in enumerate(live):
            entry = held[h]
            entry[0] = slot
            self._classes[slot] = 1 + entry[1]
        self._next = len(live)
