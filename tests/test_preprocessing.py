"""The corpus tokenized once into an on-disk cache, the BPE learnt from a sample, and token-budget batches split
between processes: each against the tokenizer itself, a plain reference loop, or Accelerate's own sharding."""

import copy
import os

import datasets
import numpy as np
import pytest
from accelerate.data_loader import BatchSamplerShard

from hf_vanilla.data import load_parallel_corpus
from hf_vanilla.training import TokenBudgetBatchSampler, preprocessing
from hf_vanilla.training.batching import length_sorted_order
from hf_vanilla.training.preprocessing import prepare_tokenizer, sample_sentences, tokenize_corpus


@pytest.fixture(scope="module")
def loaded_corpus():
    return load_parallel_corpus("multi30k", "en", "de", max_examples={"train": 3000, "validation": 100, "test": 100})


@pytest.fixture
def corpus(loaded_corpus, own):
    return own(loaded_corpus)


def test_tokenized_cache_holds_the_tokenizers_ids_in_16_bits_and_drops_only_long_training_pairs(
    corpus, small_tokenizer, tmp_path
):
    tokenized = tokenize_corpus(corpus, small_tokenizer, max_length=30, cache_dir=tmp_path, num_workers=1)
    assert tokenized.built and tokenized.path.parent == tmp_path / "tokenized"
    train = tokenized.splits["train"]
    assert str(train.features["input_ids"].feature.dtype) == "uint16"  # a 400-entry vocabulary
    reference = small_tokenizer(list(corpus["train"]["source"]), text_target=list(corpus["train"]["target"]))
    kept = [
        (source, target)
        for source, target in zip(reference["input_ids"], reference["labels"], strict=True)
        if len(source) <= 30 and len(target) <= 30
    ]
    assert 0 < tokenized.dropped == 3000 - len(kept) == 3000 - len(train)
    assert train["input_ids"] == [source for source, _ in kept] and train["labels"] == [target for _, target in kept]
    assert train["source_length"] == [len(source) for source, _ in kept]
    assert train["target_length"] == [len(target) for _, target in kept]
    test = tokenized.splits["test"]  # evaluation pairs are never dropped, however long
    assert (
        len(test) == 100 and test["labels"] == small_tokenizer(text_target=list(corpus["test"]["target"]))["input_ids"]
    )


def test_a_second_run_opens_the_cache_and_a_change_of_limit_or_data_builds_another(corpus, small_tokenizer, tmp_path):
    first = tokenize_corpus(corpus, small_tokenizer, max_length=30, cache_dir=tmp_path, num_workers=1)
    again = tokenize_corpus(corpus, small_tokenizer, max_length=30, cache_dir=tmp_path, num_workers=1)
    assert not again.built and again.path == first.path and again.dropped == first.dropped
    assert again.splits["train"]["labels"] == first.splits["train"]["labels"]
    other_limit = tokenize_corpus(corpus, small_tokenizer, max_length=200, cache_dir=tmp_path, num_workers=1)
    assert other_limit.built and other_limit.path != first.path and other_limit.dropped == 0
    fewer = datasets.DatasetDict({**corpus, "train": corpus["train"].select(range(100))})
    assert tokenize_corpus(fewer, small_tokenizer, max_length=30, cache_dir=tmp_path, num_workers=1).built
    assert not list(tmp_path.glob("tokenized/*/tmp*")), "nothing half-written is left behind"


@pytest.mark.parametrize(
    "call",
    [{"padding": True}, {"truncation": True, "max_length": 5}, {"padding": "max_length", "max_length": 40}],
    ids=["padding", "truncation", "max_length"],
)
def test_a_tokenizer_called_with_padding_or_truncation_opens_the_cache_a_fresh_one_built(
    corpus, small_tokenizer, tmp_path, call
):
    fresh = tokenize_corpus(corpus, small_tokenizer, max_length=30, cache_dir=tmp_path, num_workers=1)
    used = copy.deepcopy(small_tokenizer)
    used(["A dog runs.", "Two dogs run in the snow."], **call)  # leaves the call's settings on the Rust backend
    assert used.backend_tokenizer.padding is not None or used.backend_tokenizer.truncation is not None
    again = tokenize_corpus(corpus, used, max_length=30, cache_dir=tmp_path, num_workers=1)
    assert not again.built and again.path == fresh.path
    assert again.splits["train"]["input_ids"] == fresh.splits["train"]["input_ids"]


def test_two_worker_processes_give_the_same_cache_as_one(corpus, small_tokenizer, tmp_path, monkeypatch):
    one = tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path / "one", num_workers=1)
    monkeypatch.setattr(preprocessing, "MIN_PAIRS_PER_WORKER", 1000)  # so that 3000 pairs take both workers
    encode_pairs, pids = preprocessing.PairEncoder.__call__, tmp_path / "pids"

    def encode_and_record_the_process(*args, **kwargs):
        with open(pids, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        return encode_pairs(*args, **kwargs)

    monkeypatch.setattr(preprocessing.PairEncoder, "__call__", encode_and_record_the_process)
    two = tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path / "two", num_workers=2)
    assert len(set(pids.read_text().split()) - {str(os.getpid())}) == 2, "the training split took two processes"
    assert two.splits["train"].to_dict() == one.splits["train"].to_dict()


def test_the_cache_is_opened_not_rewritten_under_disable_caching(corpus, small_tokenizer, tmp_path):
    first = tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path, num_workers=1)
    files = {path.name: path.stat().st_ino for path in first.path.glob("*.arrow")}
    datasets.disable_caching()  # what a user's script may have done: it is about datasets' own transforms
    try:
        again = tokenize_corpus(corpus, small_tokenizer, 30, cache_dir=tmp_path, num_workers=1)
    finally:
        datasets.enable_caching()
    assert not again.built and {path.name: path.stat().st_ino for path in again.path.glob("*.arrow")} == files


def test_the_tokenized_files_hold_record_batches_of_the_intended_size(corpus, small_tokenizer, tmp_path, monkeypatch):
    import pyarrow as pa

    monkeypatch.setattr(preprocessing, "WRITER_BATCH_ROWS", 1000)
    monkeypatch.setattr(preprocessing, "ENCODE_ROWS", 300)  # encoded in pieces, written whole
    tokenized = tokenize_corpus(corpus, small_tokenizer, max_length=1000, cache_dir=tmp_path, num_workers=1)
    with pa.memory_map(str(tokenized.path / "train.arrow")) as source:
        sizes = [batch.num_rows for batch in pa.ipc.open_stream(source)]
    assert sizes == [1000, 1000, 1000]  # 3000 pairs, none over the limit


def test_in_memory_views_of_one_table_are_told_apart(corpus):
    from hf_vanilla.training.preprocessing import dataset_identity

    table = datasets.Dataset.from_dict({"source": ["a b", "c", "d e f", "g"], "target": ["1", "2 3", "4", "5 6"]})
    views = [table.select([0, 1]), table.select([2, 3]), table.shuffle(seed=0), table]
    identities = [dataset_identity(view) for view in views]
    assert len({repr(identity) for identity in identities}) == 4, "each view's rows are their own key"
    assert dataset_identity(table.select([0, 1])) == identities[0], "the same rows, the same key"


def test_bpe_learns_from_a_sample_once_and_later_runs_reuse_it(corpus, tmp_path, monkeypatch):
    sentences = [s for batch in sample_sentences(corpus["train"], 1000) for s in batch]
    assert 800 < len(sentences) < 1200  # about the sample asked for, both sides of each drawn pair
    everything = set(corpus["train"]["source"]) | set(corpus["train"]["target"])
    assert set(sentences) <= everything
    assert len([s for batch in sample_sentences(corpus["train"], 10**9) for s in batch]) == 6000

    first = prepare_tokenizer(corpus["train"], 500, 2000, tmp_path / "run1", tmp_path / "cache")
    assert (tmp_path / "run1" / "tokenizer" / "tokenizer.json").is_file()

    def must_not_train(*args, **kwargs):
        raise AssertionError("the cached tokenizer should have been reused")

    monkeypatch.setattr(preprocessing, "train_bpe_tokenizer", must_not_train)
    second = prepare_tokenizer(corpus["train"], 500, 2000, tmp_path / "run2", tmp_path / "cache")
    assert second.backend_tokenizer.to_str() == first.backend_tokenizer.to_str()


def test_a_resume_takes_the_checkpoints_tokenizer_and_refuses_another_naming_both(small_tokenizer, tmp_path):
    """The checkpoint's ids are its tokenizer's: resumed, a run reads the tokenizer from the checkpoint (not the BPE it
    would learn), accepts a --tokenizer that is the same one saved elsewhere, and refuses another,
    naming both folders and the fix. A fresh start takes any --tokenizer."""
    from hf_vanilla.tokenization import train_bpe_tokenizer
    from hf_vanilla.training.arguments import parse_arguments
    from hf_vanilla.training.callbacks import StartupClock
    from hf_vanilla.training.preprocessing import tokenizer_identity
    from hf_vanilla.training.recipe import prepare_data

    output = tmp_path / "run"
    for folder in (output / "checkpoint-2", tmp_path / "same"):
        small_tokenizer.save_pretrained(folder)
    train_bpe_tokenizer(["ein hund läuft", "zwei männer sitzen"] * 50, 300, show_progress=False).save_pretrained(
        tmp_path / "other"
    )

    def prepared_tokenizer(*options: str):
        recipe, training_args = parse_arguments(
            ["--data", "multi30k", "--max_train_examples", "200", "--max_eval_examples", "20", "--max_test_examples",
             "20", "--output_dir", str(output), "--data_cache_dir", str(tmp_path / "cache"), *options]
        )  # fmt: skip
        return prepare_data(recipe, training_args, output, StartupClock(0)).tokenizer

    expected = tokenizer_identity(small_tokenizer)
    assert tokenizer_identity(prepared_tokenizer("--resume_from_checkpoint", "last")) == expected
    same = prepared_tokenizer("--resume_from_checkpoint", "last", "--tokenizer", str(tmp_path / "same"))
    assert tokenizer_identity(same) == expected
    with pytest.raises(ValueError, match="--tokenizer .*other is not the tokenizer this run was trained with") as err:
        prepared_tokenizer("--resume_from_checkpoint", "last", "--tokenizer", str(tmp_path / "other"))
    assert f"Resume with --tokenizer {output / 'checkpoint-2'}," in str(err.value)
    assert len(prepared_tokenizer("--tokenizer", str(tmp_path / "other"))) != len(small_tokenizer)


# Token-budget batches


def greedy_reference(lengths: np.ndarray, order: np.ndarray, max_tokens: int) -> list[list[int]]:
    """fairseq's packing, one pair at a time: the definition the vectorised sampler must reproduce."""
    batches, batch, longest = [], [], 0
    for index in order.tolist():
        if batch and max(longest, lengths[index]) * (len(batch) + 1) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(index)
        longest = max(longest, int(lengths[index]))
    return [*batches, batch]


def test_vectorised_packing_equals_the_one_pair_at_a_time_loop():
    rng = np.random.default_rng(1)
    sources, targets = rng.integers(1, 120, 20_000), rng.integers(1, 130, 20_000)
    lengths = np.maximum(sources, targets)
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=1000, seed=4, shuffle=False)
    order = np.random.default_rng(4).permutation(len(lengths))
    order = order[np.argsort(lengths[order], kind="stable")]
    assert list(sampler) == greedy_reference(lengths, order, 1000)


@pytest.mark.parametrize("processes, accumulation", [(2, 1), (3, 1), (8, 1), (3, 2)])
def test_batches_split_between_processes_see_every_pair_once(processes, accumulation):
    rng = np.random.default_rng(processes)
    sources, targets = rng.integers(1, 60, 1001), rng.integers(1, 60, 1001)
    lengths = np.maximum(sources, targets)
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=256, seed=2, batches_per_update=processes * accumulation)
    assert len(sampler) % (processes * accumulation) == 0
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        # Accelerate's own sharding, as `accelerator.prepare` applies it to the training loader
        per_rank = [list(BatchSamplerShard(sampler, processes, rank)) for rank in range(processes)]
        assert {len(batches) for batches in per_rank} == {len(sampler) // processes}, "the same steps everywhere"
        seen = sorted(i for batches in per_rank for batch in batches for i in batch)
        assert seen == list(range(1001)), "no pair twice, none lost"
        assert all(len(b) * lengths[b].max() <= 256 for batches in per_rank for b in batches)


def global_pairs(lengths: np.ndarray, epoch: int) -> list[int]:
    """An epoch's pairs in their global order: what one process taking one batch an update visits (no batch cut)."""
    alone = TokenBudgetBatchSampler(lengths, max_tokens=200, seed=1)
    alone.set_epoch(epoch)
    return [pair for batch in alone for pair in batch]


@pytest.mark.parametrize("before, after", [(4, 1), (4, 6), (1, 4), (6, 7)])
def test_a_resume_with_another_update_size_continues_the_global_order_exactly(before, after):
    """Stopped after any whole update of a run taking `before` batches an update, a sampler taking `after` resumes at
    the recorded pairs: the pairs it gives are the rest of the epoch's global order, none twice, none lost, every
    update full. The pair sequence is the same whatever the update size, so the tails' cuts never reorder it."""
    lengths = np.random.default_rng(7).integers(1, 50, 700)
    first = TokenBudgetBatchSampler(lengths, max_tokens=200, seed=1, batches_per_update=before)
    first.set_epoch(2)
    order = global_pairs(lengths, 2)
    stream = list(first)
    assert [pair for batch in stream for pair in batch] == order
    for updates in range(1, len(stream) // before):
        pairs_done = first.pairs_in(2, updates * before)
        assert pairs_done == sum(map(len, stream[: updates * before]))
        resumed = TokenBudgetBatchSampler(lengths, max_tokens=200, seed=1, batches_per_update=after)
        resumed.resume(2, pairs_done)
        resumed.set_epoch(2)
        rest = list(resumed)
        assert len(rest) % after == 0
        assert [pair for batch in rest for pair in batch] == order[pairs_done:]
        resumed.set_epoch(3)  # the next epoch is whole again
        assert [pair for batch in resumed for pair in batch] == global_pairs(lengths, 3)


def test_an_epoch_whose_last_batches_hold_too_few_pairs_cuts_whole_updates_more():
    # 5 batches of 1 long pair each, then batches of many short ones: 4 batches an update leave the last batch
    # (1 pair, in sorted order without shuffling) alone in its update, too few pairs for 4 pieces.
    lengths = np.array([10] * 40 + [100] * 5)
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=100, shuffle=False, batches_per_update=4)
    batches = list(sampler)
    assert len(batches) == len(sampler) and len(batches) % 4 == 0
    assert [pair for batch in batches for pair in batch] == sampler.order.tolist()
    assert all(batch for batch in batches)


def test_more_processes_than_pairs_can_fill_is_a_clear_error():
    with pytest.raises(ValueError, match="too few training pairs for this many processes"):
        TokenBudgetBatchSampler([5], max_tokens=64, batches_per_update=2)
    sampler = TokenBudgetBatchSampler([5] * 8, max_tokens=10, shuffle=False, batches_per_update=4)
    sampler.resume(0, 6)  # 2 pairs left for an update of 4 batches
    with pytest.raises(ValueError, match="The 2 pairs left in epoch 0 cannot fill an update of 4 batches"):
        list(sampler)


def test_the_sampler_keeps_one_int32_index_per_pair_and_no_python_lists():
    # The memory the sampler keeps: one int32 index per pair and one int64 bound per batch, no Python lists.
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 80, 400_000).astype(np.int32)
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=4096, seed=0)
    assert sampler.order.dtype == np.int32 and sampler.order.nbytes == 4 * 400_000
    assert sampler.bounds.dtype == np.int64 and sampler.bounds[-1] == 400_000


@pytest.mark.parametrize("pairs, chunk", [(1000, 64), (50_000, 4096), (50_000, 1 << 22)])
def test_the_length_order_is_the_stable_argsort_of_the_seeded_permutation(pairs, chunk, monkeypatch):
    from hf_vanilla.training import batching

    monkeypatch.setattr(batching, "SORT_CHUNK", chunk)  # keys written across chunk boundaries
    lengths = np.random.default_rng(1).integers(1, 300, pairs).astype(np.uint16)
    shuffled = np.random.default_rng(5).permutation(pairs)
    expected = shuffled[np.argsort(lengths[shuffled], kind="stable")]
    order = length_sorted_order(lengths, seed=5)
    assert order.dtype == np.int32 and np.array_equal(order, expected)
    assert not np.array_equal(order, length_sorted_order(lengths, seed=6))  # ties follow the seed
