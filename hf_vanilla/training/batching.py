"""Token-budget batching (fairseq's `--max-tokens`): batches of similar-length pairs under a padded-token budget."""

import numpy as np
from torch.utils.data import Sampler

from ..batching import pack_by_budget


def length_sorted_order(lengths: np.ndarray, seed: int) -> np.ndarray:
    """The indices of `lengths` by length, ties in seeded random order (32-bit where they fit: what a process keeps
    of the corpus, 4 bytes a pair)."""
    index_type = np.int32 if len(lengths) < 2**31 else np.int64
    shuffled = np.random.default_rng(seed).permutation(len(lengths)).astype(index_type)
    return shuffled[np.argsort(lengths[shuffled], kind="stable")]


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
