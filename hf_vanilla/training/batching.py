"""Token-budget batching (fairseq's `--max-tokens`): batches of similar-length pairs under a padded-token budget."""

import numpy as np
import pyarrow.compute as pc
from torch.utils.data import Dataset, Sampler

from ..packing import pack_by_budget


SORT_CHUNK = 1 << 22  # positions written into the sort keys at a time


def pair_lengths(tokenized) -> np.ndarray:
    """The longer side of each tokenized pair, what the token-budget sampler batches by: computed by Arrow from the
    `source_length` and `target_length` columns, two bytes a pair."""
    table = tokenized.with_format("arrow").select_columns(["source_length", "target_length"])[:]
    return pc.max_element_wise(table.column("source_length"), table.column("target_length")).to_numpy()


def length_sorted_order(lengths: np.ndarray, seed: int) -> np.ndarray:
    """The indices of `lengths` by length, ties in seeded random order: `shuffled[argsort(lengths[shuffled],
    stable)]` for a seeded permutation `shuffled`, as 32-bit indices (4 bytes a pair: what a process keeps of the
    corpus).

    Computed as one in-place sort of 64-bit keys (length << 32 | position in `shuffled`), which are unique, so the
    order of ties is their position, as in the stable argsort, without the argsort's int64 result and radix buffer
    beside them (`tests/test_preprocessing.py` checks the order against the argsort; docs/training.md, "Scale", has
    the memory of a process at 36M pairs)."""
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


def halve_largest(pieces: list[list[int]], count: int) -> list[list[int]]:
    """`pieces` ([batch, first, end] ranges of batches, in order) cut into `count`, by halving the piece of most pairs
    until there are that many; every half keeps its place in the order and still fits the budget."""
    pieces = [list(piece) for piece in pieces]
    while len(pieces) < count:
        largest = max(range(len(pieces)), key=lambda i: pieces[i][2] - pieces[i][1])
        batch, first, end = pieces[largest]
        middle = first + (end - first) // 2
        pieces[largest : largest + 1] = [[batch, first, middle], [batch, middle, end]]
    return pieces


def refuse_split_batches(split_batches: bool) -> None:
    """Token-budget batches are dealt whole, one to a process in turn: Accelerate's `split_batches`, which would cut
    each batch into one slice per process, is refused in one line naming the fix."""
    if split_batches:
        raise ValueError(
            "accelerator_config split_batches=True cannot split token-budget batches: each process takes whole "
            "batches of up to --max_tokens tokens in turn (an update holds max_tokens x processes x "
            "gradient_accumulation_steps). Drop split_batches, and set --max_tokens per process."
        )


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of similar-length pairs holding at most `max_tokens` tokens each, padding included (fairseq's
    `--max-tokens`): `lengths` holds each pair's longer side, and a batch of n pairs costs n * its longest. Batches
    are formed once from a seeded, length-sorted order, so they depend on the pairs, `max_tokens` and `seed` alone,
    and are visited in a new order each epoch: the epoch's global order, the same on any number of processes.

    Every update takes `batches_per_update` batches of that order (processes x gradient accumulation steps; Accelerate
    deals them to the processes in turn). So that every update and every process gets its full share, with no pair
    given twice or to none, the batches that end an epoch short of a whole update are cut, in order, into as many
    pieces as an update takes (`epoch_ranges`).

    `resume(epoch, pairs_done)` starts that epoch after its first `pairs_done` pairs in the global order: a run resumed
    on another number of processes trains next exactly the pairs an uninterrupted run would have."""

    def __init__(
        self,
        lengths,
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        batches_per_update: int = 1,
    ):
        lengths = np.asarray(lengths)
        if lengths.size == 0:
            raise ValueError("No training pairs to batch.")
        if lengths.max() > max_tokens:
            raise ValueError(
                f"A pair of {lengths.max()} tokens exceeds `max_tokens`={max_tokens}; raise `max_tokens` or lower "
                "`max_length` so long pairs are filtered out."
            )
        if lengths.size < batches_per_update:
            raise ValueError(
                f"{lengths.size} training pairs cannot give each of {batches_per_update} batches of an update "
                "(processes x gradient accumulation steps) a pair: too few training pairs for this many processes; "
                "use fewer processes or more data."
            )
        self.seed, self.shuffle, self.epoch = seed, shuffle, 0
        self.batches_per_update = batches_per_update
        self.iterated_epoch: int | None = None  # the epoch whose order the last iteration visits
        self.resumed_at: tuple[int, int] = (0, 0)  # (epoch, pairs of it already trained)
        self.order = length_sorted_order(lengths, seed)
        sorted_lengths = lengths[self.order]
        self.bounds = pack_by_budget(np.maximum(sorted_lengths, 1, out=sorted_lengths), max_tokens)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, pairs_done: int) -> None:
        """Start `epoch` after its first `pairs_done` pairs in the global order (those were trained)."""
        if not 0 <= pairs_done < len(self.order):
            raise ValueError(f"pairs_done={pairs_done}: an epoch has {len(self.order)} pairs.")
        self.resumed_at = (epoch, pairs_done)

    def epoch_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """`epoch`'s batches in its order, and the pairs each holds (before any cut)."""
        count = len(self.bounds) - 1
        batches = np.random.default_rng(self.seed + epoch).permutation(count) if self.shuffle else np.arange(count)
        return batches, np.diff(self.bounds)[batches]

    def whole_batches_in(self, epoch: int, pairs_done: int) -> int:
        """How many whole batches of `epoch`'s order its first `pairs_done` pairs hold."""
        _, sizes = self.epoch_order(epoch)
        return int(np.searchsorted(np.cumsum(sizes), pairs_done, side="right"))

    def epoch_ranges(self, epoch: int) -> np.ndarray:
        """The epoch's batches still to train, in order, as [batch, first, end] rows (positions in the batch), the
        last ones cut so that their number is a multiple of `batches_per_update`.

        The cut takes the batches that end the epoch short of a whole update (or, where those hold fewer pairs than
        an update has batches, as many whole updates more as it takes) and halves their largest pieces."""
        batches, sizes = self.epoch_order(epoch)
        ranges = np.stack([batches, np.zeros_like(sizes), sizes], axis=1)
        resumed_epoch, pairs_done = self.resumed_at
        if epoch == resumed_epoch and pairs_done:
            ends = np.cumsum(sizes)
            first = int(np.searchsorted(ends, pairs_done, side="right"))  # the first batch not wholly trained
            ranges = ranges[first:]
            ranges[0, 1] = pairs_done - (ends[first - 1] if first else 0)
        short = len(ranges) % self.batches_per_update
        if not short:
            return ranges
        pairs = ranges[:, 2] - ranges[:, 1]
        for cut in range(short, len(ranges) + 1, self.batches_per_update):
            pieces = cut + self.batches_per_update - short
            if pairs[-cut:].sum() >= pieces:
                return np.concatenate([ranges[:-cut], halve_largest(ranges[-cut:].tolist(), pieces)])
        raise ValueError(
            f"The {pairs.sum()} pairs left in epoch {epoch} cannot fill an update of {self.batches_per_update} "
            "batches (processes x gradient accumulation steps): resume on fewer processes."
        )

    def pairs_in(self, epoch: int, batches: int) -> int:
        """How many pairs the first `batches` batches of `epoch_ranges(epoch)` hold, the pairs trained before them
        included (where the epoch was resumed): the position to resume at once they are trained."""
        ranges = self.epoch_ranges(epoch)[:batches]
        resumed_epoch, pairs_done = self.resumed_at
        return int((ranges[:, 2] - ranges[:, 1]).sum()) + (pairs_done if epoch == resumed_epoch else 0)

    def __iter__(self):
        self.iterated_epoch = self.epoch
        for batch, first, end in self.epoch_ranges(self.epoch).tolist():
            yield self.order[self.bounds[batch] + first : self.bounds[batch] + end].tolist()

    def __len__(self) -> int:
        """The number of batches of a whole epoch (what the Trainer counts an epoch's updates by): a multiple of
        `batches_per_update`. A resumed epoch yields fewer."""
        batches = len(self.bounds) - 1
        return batches + -batches % self.batches_per_update


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
