"""Token-budget batching (fairseq's `--max-tokens`): batches of similar-length pairs under a padded-token budget."""

import numpy as np
from torch.utils.data import Sampler


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of similar-length pairs holding at most `max_tokens` tokens each, padding included (fairseq's
    `--max-tokens`): a batch of n pairs costs n * its longest side. Batches are formed once from a seeded,
    length-sorted order (so their number is fixed, as the Trainer needs) and visited in a new order each epoch."""

    def __init__(
        self,
        source_lengths: list[int],
        target_lengths: list[int],
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
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
        order = np.random.default_rng(seed).permutation(len(lengths))
        order = order[np.argsort(lengths[order], kind="stable")]  # by length; ties in seeded random order
        self.batches: list[list[int]] = []
        batch: list[int] = []
        longest = 0
        for index in order.tolist():
            longest_if_added = max(longest, int(lengths[index]))
            if batch and longest_if_added * (len(batch) + 1) > max_tokens:
                self.batches.append(batch)
                batch, longest_if_added = [], int(lengths[index])
            batch.append(index)
            longest = longest_if_added
        self.batches.append(batch)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = range(len(self.batches))
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(len(self.batches)).tolist()
        for position in order:
            yield self.batches[position]

    def __len__(self) -> int:
        return len(self.batches)
