"""A hash table over 64-bit keys held in numpy arrays, probed for many keys in one vectorised step: how
:meth:`~scheduler_core.k8s.nodes.NodeTable.rows_of` finds the rows of node names."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, eq=False)
class HashIndex:
    """A bucketed hash table over 64-bit keys, in numpy arrays: ``keys`` and ``rows`` of shape
    (n_buckets, 8), a bucket per key's low bits, one 64-byte cache line of keys each, with on average
    at most two keys of eight. :meth:`find` reads each wanted key's bucket and compares all eight at
    once, for all wanted keys in one vectorised step. The rare keys that find their bucket full, and
    the key 0 (an empty slot's), are kept in ``spill``, a dict read only for keys found nowhere else."""

    keys: npt.NDArray[np.int64]
    rows: npt.NDArray[np.int32]
    spill: dict[int, int]

    WIDTH = 8

    @classmethod
    def build(cls, keys: npt.NDArray[np.int64]) -> HashIndex:
        """Index ``keys`` (row i has key i); a duplicated key keeps its first row.

        >>> index = HashIndex.build(np.array([5, 21, 5, 0, 37], dtype=np.int64))
        >>> index.find(np.array([37, 5, 6, 21, 0], dtype=np.int64)).tolist(), index.spill
        ([4, 0, -1, 1, 3], {0: 3})
        """
        n_buckets = 1 << max(0, (len(keys) // 2).bit_length())  # at least n/2 buckets: two keys each at most
        _, first = np.unique(keys, return_index=True)  # a duplicated key is indexed once, at its first row
        first.sort()
        bucket = keys[first] & (n_buckets - 1)
        order = np.argsort(bucket, kind="stable")
        starts = np.searchsorted(bucket[order], np.arange(n_buckets))
        rank = np.arange(len(first)) - starts[bucket[order]]
        slot_keys = np.zeros((n_buckets, cls.WIDTH), dtype=np.int64)
        slot_rows = np.full((n_buckets, cls.WIDTH), -1, dtype=np.int32)
        placed = first[order]
        fits = (rank < cls.WIDTH) & (keys[placed] != 0)
        slot_keys[bucket[order][fits], rank[fits]] = keys[placed[fits]]
        slot_rows[bucket[order][fits], rank[fits]] = placed[fits]
        spill = {int(keys[row]): row for row in placed[~fits].tolist()}
        return cls(slot_keys, slot_rows, spill)

    def find(self, wanted: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
        """The row of each wanted key (shape (k,)), -1 where none has it."""
        bucket = wanted & (len(self.keys) - 1)
        # np.take, and a compare without broadcasting: each 1.5-2x faster than the obvious forms here.
        equal = np.take(self.keys, bucket, axis=0) == np.repeat(wanted, self.WIDTH).reshape(-1, self.WIDTH)
        which, slot = np.divmod(np.flatnonzero(equal), self.WIDTH)
        found = np.full(len(wanted), -1, dtype=np.intp)
        found[which] = np.take(self.rows.ravel(), bucket[which] * self.WIDTH + slot)  # one slot per key at most
        if self.spill:
            missing = np.flatnonzero(found < 0)
            found[missing] = [self.spill.get(key, -1) for key in wanted[missing].tolist()]
        return found
