"""Token-budget batching (fairseq's `--max-tokens`): batches of similar-length pairs under a padded-token budget."""

import numpy as np
from torch.utils.data import Sampler

from ..batching import pack_by_budget


SORT_CHUNK = 1 << 20  # pairs sorted at a time by `length_sorted_order`


def length_sorted_order(lengths: np.ndarray, seed: int) -> np.ndarray:
    """The indices of `lengths` by length, ties in seeded random order: `shuffled[argsort(lengths[shuffled],
    stable)]` for a seeded permutation `shuffled`, computed as a stable counting sort a chunk at a time. What grows
    with the corpus is the result (32-bit indices where they fit: 160 MB at 40M pairs, what a process holds for the
    corpus) and the permutation while it is sorted; a whole-corpus argsort took 64-bit indices and its temporaries,
    ~26 bytes a pair, of which the allocator kept ~12 while the result lived (measured at 4M pairs)."""
    index_type = np.int32 if len(lengths) < 2**31 else np.int64
    order = np.empty(len(lengths), dtype=index_type)  # allocated first, so it pins no freed temporary below it
    shuffled = np.arange(len(lengths), dtype=index_type)
    np.random.default_rng(seed).shuffle(shuffled)
    counts = np.bincount(lengths)
    next_slot = np.cumsum(counts) - counts  # where each length's run begins in `order`
    for start in range(0, len(lengths), SORT_CHUNK):
        members = shuffled[start : start + SORT_CHUNK]
        keys = lengths[members]
        by_key = np.argsort(keys, kind="stable")
        sorted_keys = keys[by_key]
        rank = np.arange(len(keys)) - np.searchsorted(sorted_keys, sorted_keys)  # place within its length's run
        order[next_slot[sorted_keys] + rank] = members[by_key]
        next_slot += np.bincount(keys, minlength=len(next_slot))
    return order


def split_largest_batches(bounds: np.ndarray, count: int) -> np.ndarray:
    """`bounds` with the `count` batches of most pairs each cut in two (every half still fits the budget)."""
    sizes = np.diff(bounds)
    largest = np.argsort(-sizes, kind="stable")[:count]
    if count > len(sizes) or sizes[largest].min(initial=2) < 2:
        raise ValueError(
            f"Cannot split {len(sizes)} batches into a number divisible by the process count: too few training "
            "pairs for this many processes; use fewer processes or more data."
        )
    return np.sort(np.concatenate([bounds, bounds[largest] + sizes[largest] // 2]))


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of similar-length pairs holding at most `max_tokens` tokens each, padding included (fairseq's
    `--max-tokens`): a batch of n pairs costs n * its longest side. Batches are formed once from a seeded,
    length-sorted order (so their number is fixed, as the Trainer needs) and visited in a new order each epoch.

    With `num_shards` processes, the number of batches is made a multiple of it (by halving the largest batches), so
    that Accelerate's sharding (process i takes batches i, i + n, ...) gives every process the same number of batches
    and no pair to two processes or to none. Pairs are held as one index array (not a list per batch), so 40M pairs
    cost 160 MB and a few seconds."""

    def __init__(
        self,
        source_lengths,
        target_lengths,
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        num_shards: int = 1,
    ):
        lengths = np.maximum(np.asarray(source_lengths), np.asarray(target_lengths))
        if lengths.size == 0:
            raise ValueError("No training pairs to batch.")
        if lengths.max() > max_tokens:
            raise ValueError(
                f"A pair of {lengths.max()} tokens exceeds `max_tokens`={max_tokens}; raise `max_tokens` or lower "
                "`max_length` so long pairs are filtered out."
            )
        self.seed, self.shuffle, self.epoch = seed, shuffle, 0
        self.order = length_sorted_order(lengths, seed)
        sorted_lengths = lengths[self.order]
        self.bounds = pack_by_budget(np.maximum(sorted_lengths, 1, out=sorted_lengths), max_tokens)
        shortfall = -(len(self.bounds) - 1) % num_shards
        if shortfall:
            self.bounds = split_largest_batches(self.bounds, shortfall)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        batches = np.arange(len(self))
        if self.shuffle:
            batches = np.random.default_rng(self.seed + self.epoch).permutation(len(self))
        for batch in batches.tolist():
            yield self.order[self.bounds[batch] : self.bounds[batch + 1]].tolist()

    def __len__(self) -> int:
        return len(self.bounds) - 1
