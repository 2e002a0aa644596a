"""Token-budget packing (fairseq's `--max-tokens`), shared by training batches and translation batches."""

import numpy as np


def pack_by_budget(sorted_lengths: np.ndarray, max_tokens: int, max_items: int | None = None) -> np.ndarray:
    """Start offsets of the batches (and the end) that greedily fill `max_tokens` along lengths sorted ascending: a
    batch of n items costs n * its last (longest) length, and holds at most `max_items`. One vectorised step per
    batch, not per item. Every length must be at least 1 and at most `max_tokens`."""
    bounds, start, total = [0], 0, len(sorted_lengths)
    while start < total:
        room = max_tokens // int(sorted_lengths[start])
        window = sorted_lengths[start : start + (min(room, max_items) if max_items else room)]
        fits = window * np.arange(1, len(window) + 1) <= max_tokens  # True up to the first item that overflows
        start += len(window) if fits[-1] else int(np.argmin(fits))
        bounds.append(start)
    return np.asarray(bounds, dtype=np.int64)
