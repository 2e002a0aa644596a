"""Token-budget batching (fairseq's `--max-tokens`): batches of similar-length pairs under a padded-token budget."""

import numpy as np
from torch.utils.data import Dataset, Sampler

from ..packing import pack_by_budget


SORT_CHUNK = 1 << 22  # positions written into the sort keys at a time


def length_sorted_order(lengths: np.ndarray, seed: int) -> np.ndarray:
    """The indices of `lengths` by length, ties in seeded random order: `shuffled[argsort(lengths[shuffled],
    stable)]` for a seeded permutation `shuffled`, as 32-bit indices (4 bytes a pair: what a process keeps of the
    corpus).

    Computed as one in-place sort of 64-bit keys (length << 32 | position in `shuffled`), which are unique, so the
    order of ties is their position, as in the stable argsort. At 36M pairs the argsort's int64 result and radix
    buffer peaked 756 MiB above its input, these keys 550 MiB (`tests/test_preprocessing.py` checks the order
    against the argsort; the memory goal of a process at 36M pairs is 1.5 GiB in all)."""
    if len(lengths) >= 2**32:
        raise ValueError(f"{len(lengths)} pairs: the sampler orders at most 2**32 pairs per process.")
    shuffled = np.arange(len(lengths), dtype=np.int32 if len(lengths) < 2**31 else np.int64)
    np.random.default_rng(seed).shuffle(shuffled)
    keys = lengths[shuffled].astype(np.uint64)
    keys <<= 32
    for start in range(0, len(keys), SORT_CHUNK):
        stop = min(start + SORT_CHUNK, len(keys))
        keys[start:stop] |= np.arange(start, stop, dtype=np.uint64)
    keys.sort()
    np.bitwise_and(keys, 0xFFFFFFFF, out=keys)
    return shuffled[keys]


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
    `--max-tokens`): `lengths` holds each pair's longer side, and a batch of n pairs costs n * its longest. Batches
    are formed once from a seeded, length-sorted order (so their number is fixed, as the Trainer needs) and visited
    in a new order each epoch.

    With `num_shards` processes, the number of batches is made a multiple of it (by halving the largest batches), so
    that Accelerate's sharding (process i takes batches i, i + n, ...) gives every process the same number of batches
    and no pair to two processes or to none. Pairs are held as one index array (not a list per batch)."""

    def __init__(
        self,
        lengths,
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        num_shards: int = 1,
    ):
        lengths = np.asarray(lengths)
        if lengths.size == 0:
            raise ValueError("No training pairs to batch.")
        if lengths.max() > max_tokens:
            raise ValueError(
                f"A pair of {lengths.max()} tokens exceeds `max_tokens`={max_tokens}; raise `max_tokens` or lower "
                "`max_length` so long pairs are filtered out."
            )
        self.seed, self.shuffle, self.epoch = seed, shuffle, 0
        self.iterated_epoch: int | None = None  # the epoch whose order the last iteration visits
        self.order = length_sorted_order(lengths, seed)
        sorted_lengths = lengths[self.order]
        self.bounds = pack_by_budget(np.maximum(sorted_lengths, 1, out=sorted_lengths), max_tokens)
        shortfall = -(len(self.bounds) - 1) % num_shards
        if shortfall:
            self.bounds = split_largest_batches(self.bounds, shortfall)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        self.iterated_epoch = self.epoch
        batches = np.arange(len(self))
        if self.shuffle:
            batches = np.random.default_rng(self.seed + self.epoch).permutation(len(self))
        for batch in batches.tolist():
            yield self.order[self.bounds[batch] : self.bounds[batch + 1]].tolist()

    def __len__(self) -> int:
        return len(self.bounds) - 1


class EpochSettingRows(Dataset):
    """The rows a `TokenBudgetBatchSampler` batches, for a `DataLoader`, passing each epoch on to that sampler.

    The Trainer starts every epoch with `set_epoch` on its loader, Accelerate's `DataLoaderShard`, which hands it to
    the batch sampler only if it can reach one with `set_epoch`. With several processes Accelerate wraps our sampler
    in `BatchSamplerShard`, and a resume's `skip_first_batches` wraps that in `SkipBatchSampler`; neither passes
    `set_epoch` on. transformers reaches through the one wrapper, not through both, so a resumed multi-process run
    visited epoch 0's order in every epoch (`tests/test_training_e2e.py`). The loader's dataset is always reached,
    however the sampler is wrapped."""

    def __init__(self, rows, sampler: TokenBudgetBatchSampler):
        self.rows, self.sampler = rows, sampler

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return self.rows[index]

    def __getitems__(self, indices: list[int]) -> list[dict]:
        return self.rows.__getitems__(indices)  # one Arrow read a batch, as the DataLoader does with `rows` itself

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __getstate__(self) -> dict:
        # Loader workers only fetch rows: they need not receive the sampler's index of the whole corpus.
        return {"rows": self.rows, "sampler": None}
