"""The pieces the training recipe adds to Seq2SeqTrainer, each against an independent truth."""

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import torch
from safetensors.torch import load_file
from transformers import EvalPrediction, Seq2SeqTrainingArguments

from hf_vanilla.training import TokenBudgetBatchSampler, TranslationMetric, build_compute_metrics
from hf_vanilla.training.averaging import average_checkpoints, average_state_dicts, checkpoint_folders
from hf_vanilla.training.train_state import read_train_state

from .conftest import make_model


# Token-budget batching


@pytest.fixture
def lengths():
    rng = np.random.default_rng(0)
    return rng.integers(1, 40, size=500).tolist(), rng.integers(1, 45, size=500).tolist()


def test_every_batch_fits_the_budget_padding_included(lengths):
    sources, targets = lengths
    sampler = TokenBudgetBatchSampler(np.maximum(sources, targets), max_tokens=256, seed=3)
    seen = []
    for batch in sampler:
        padded = len(batch) * max(max(sources[i], targets[i]) for i in batch)
        assert padded <= 256
        seen.extend(batch)
    assert sorted(seen) == list(range(500))  # every pair exactly once
    # Greedy packing by length wastes little: padded tokens are within 15% of real ones.
    real = sum(max(s, t) for s, t in zip(sources, targets, strict=True))
    padded_total = sum(len(b) * max(max(sources[i], targets[i]) for i in b) for b in sampler)
    assert padded_total <= 1.15 * real


def test_batches_are_reshuffled_each_epoch_but_fixed_in_number_and_content(lengths):
    sampler = TokenBudgetBatchSampler(np.maximum(*lengths), max_tokens=256, seed=3)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert len(first) == len(second) == len(sampler)
    assert first != second and sorted(map(tuple, first)) == sorted(map(tuple, second))
    again = TokenBudgetBatchSampler(np.maximum(*lengths), max_tokens=256, seed=3)
    assert list(again) == first  # deterministic: what resumption relies on


def test_the_epoch_check_stops_a_run_whose_batches_come_in_another_epochs_order(lengths):
    """What a release that stopped passing `set_epoch` to the loader's dataset would do: epoch 1 in epoch 0's order."""
    from transformers import TrainerControl, TrainerState

    from hf_vanilla.training.callbacks import EpochPosition

    sampler = TokenBudgetBatchSampler(np.maximum(*lengths), max_tokens=256, seed=3)
    position, args, control, state = EpochPosition(sampler), None, TrainerControl(), TrainerState()
    position.on_epoch_begin(args, state, control)  # the Trainer's epoch 0
    next(iter(sampler))  # epoch 0's order
    position.on_step_begin(args, state, control)  # fine
    position.on_epoch_begin(args, state, control)  # the Trainer's epoch 1, and the sampler was not told
    with pytest.raises(RuntimeError, match="in epoch 1, but the batches come in the order of epoch 0"):
        position.on_step_begin(args, state, control)
    sampler.set_epoch(1)
    next(iter(sampler))
    position.on_step_begin(args, state, control)  # the epoch reached the sampler: fine


def test_the_epoch_position_counts_pairs_of_the_global_order_and_the_trainers_epoch(lengths):
    from transformers import TrainerControl, TrainerState

    from hf_vanilla.training.callbacks import EpochPosition

    sampler = TokenBudgetBatchSampler(np.maximum(*lengths), max_tokens=256, seed=3, batches_per_update=3)
    sampler.resume(1, 100)  # a checkpoint in epoch 1 after 100 pairs
    position, args, control, state = EpochPosition(sampler), None, TrainerControl(), TrainerState(global_step=40)
    position.on_epoch_begin(args, state, control)
    sampler.set_epoch(1)
    batches = list(sampler)
    state.global_step = 42  # two updates of 3 batches
    position.on_step_end(args, state, control)
    assert position.position() == (1, 100 + sum(map(len, batches[:6])))
    assert 1 < state.epoch < 2
    state.global_step = 40 + len(batches) // 3  # the epoch's last update
    position.on_step_end(args, state, control)
    assert position.position() == (2, 0) and state.epoch == 2.0


LOADER_OPTIONS = ["num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "multiprocessing_context"]


def test_the_token_budget_loader_takes_every_loader_option_the_trainer_gives_its_own(tmp_path):
    from datasets import Dataset
    from transformers import Seq2SeqTrainer

    from hf_vanilla.training import TokenBudgetSeq2SeqTrainer

    rows = [[5, 6, 2], [7, 8, 2], [9, 10, 2]] * 4  # of one length: the default collator stacks them
    lengths = [3] * len(rows)
    columns = {"input_ids": rows, "labels": rows, "source_length": lengths, "target_length": lengths}
    dataset = Dataset.from_dict(columns)
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=[],
        dataloader_num_workers=2,
        dataloader_persistent_workers=True,
        dataloader_prefetch_factor=5,
        dataloader_pin_memory=False,
        dataloader_in_order=False,
        seed=11,
    )
    trainer = TokenBudgetSeq2SeqTrainer(model=make_model(), args=args, train_dataset=dataset, max_tokens=16)
    ours, library = trainer.get_train_dataloader(), Seq2SeqTrainer.get_train_dataloader(trainer)
    assert {name: getattr(ours, name) for name in LOADER_OPTIONS} == {
        name: getattr(library, name) for name in LOADER_OPTIONS
    }
    assert ours.in_order is library.in_order is False
    # the library seeds each worker by rank (`seed_worker`), so workers of different processes draw differently
    assert (ours.worker_init_fn.func, ours.worker_init_fn.keywords) == (
        library.worker_init_fn.func,
        library.worker_init_fn.keywords,
    )
    # The rows are fetched in this process: worker processes started after test_exporters.py's ONNX Runtime and
    # OpenVINO sessions ended the suite in SIGSEGV on this Intel Xeon (fork or spawn alike).
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    in_process = TokenBudgetSeq2SeqTrainer(model=make_model(), args=args, train_dataset=dataset, max_tokens=16)
    assert sorted(
        i for batch in in_process.get_train_dataloader() for i in batch["input_ids"].flatten().tolist() if i > 2
    ) == sorted(i for row in rows for i in row if i > 2), "every row is fetched"


LOADER_WITH_WORKERS = """
import json, sys
import numpy as np
from datasets import Dataset
from transformers import Seq2SeqTrainingArguments
from hf_vanilla.training import TokenBudgetSeq2SeqTrainer
from tests.conftest import make_model

rows = [[5 + i % 40, 6, 2] for i in range(24)]
lengths = [3] * len(rows)
dataset = Dataset.from_dict({"input_ids": rows, "labels": rows, "source_length": lengths, "target_length": lengths})
args = Seq2SeqTrainingArguments(output_dir=sys.argv[1], use_cpu=True, report_to=[], dataloader_num_workers=2,
                                dataloader_persistent_workers=True, seed=11)
loader = TokenBudgetSeq2SeqTrainer(model=make_model(), args=args, train_dataset=dataset, max_tokens=9
                                   ).get_train_dataloader()
epochs = []
for epoch in range(2):
    loader.set_epoch(epoch)  # as the Trainer starts each epoch
    epochs.append([batch["input_ids"][:, 0].tolist() for batch in loader])
print(json.dumps(epochs))
"""


def test_loader_workers_fetch_each_epochs_order_in_a_fresh_process(tmp_path):
    """Real worker processes (persistent, two epochs) fetch the rows of the batches the sampler orders for each
    epoch: what the workers' copy of the loader's dataset (no sampler in it) must serve. In a fresh process: workers
    started after test_exporters.py's ONNX Runtime and OpenVINO sessions crashed the suite on an Intel Xeon."""
    import subprocess
    import sys

    root = Path(__file__).parents[1]
    run = subprocess.run([sys.executable, "-c", LOADER_WITH_WORKERS, str(tmp_path)], cwd=root, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    epochs = json.loads(run.stdout.strip().splitlines()[-1])
    sampler = TokenBudgetBatchSampler([3] * 24, max_tokens=9, seed=11)
    for epoch, fetched in enumerate(epochs):
        sampler.set_epoch(epoch)
        assert fetched == [[5 + i % 40 for i in batch] for batch in sampler], epoch
    assert epochs[0] != epochs[1]


def test_half_precision_batches_are_padded_to_a_multiple_of_8_positions(tmp_path):
    from benchmarks.synthetic import word_level_tokenizer
    from hf_vanilla.training.recipe import seq2seq_collator

    model = make_model()
    tokenizer = word_level_tokenizer(model.config.vocab_size)
    features = [{"input_ids": [5, 6, 7, 2], "labels": [8, 9, 2]}, {"input_ids": [5] * 10 + [2], "labels": [2]}]
    for bf16, length in ((False, 11), (True, 16)):
        args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, bf16=bf16, report_to=[])
        batch = seq2seq_collator(tokenizer, model, args)(features)
        assert batch["input_ids"].shape == (2, length), bf16
        assert batch["labels"].shape == batch["decoder_input_ids"].shape == (2, 8 if bf16 else 3), bf16


def resumable_run(output_dir: Path, pairs: int = 40, max_tokens: int = 40, **options):
    """A token-budget trainer of a tiny model over `pairs` synthetic pairs, saving every update."""
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq

    from benchmarks.synthetic import word_level_tokenizer
    from hf_vanilla.training import TokenBudgetSeq2SeqTrainer

    rng = np.random.default_rng(0)
    rows = [rng.integers(4, 30, rng.integers(2, 9)).tolist() + [2] for _ in range(pairs)]
    lengths = [len(row) for row in rows]
    columns = {"input_ids": rows, "labels": rows, "source_length": lengths, "target_length": lengths}
    settings = {"max_steps": 2, "save_steps": 1, "seed": 3, **options}
    args = Seq2SeqTrainingArguments(output_dir=str(output_dir), use_cpu=True, report_to=[], **settings)
    model = make_model()
    return TokenBudgetSeq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict(columns),
        data_collator=DataCollatorForSeq2Seq(word_level_tokenizer(model.config.vocab_size), model=model),
        max_tokens=max_tokens,
    )


@pytest.mark.parametrize(
    "change, option",
    [
        ({"max_tokens": 32}, "--max_tokens"),
        ({"seed": 4}, "--seed"),
        ({"pairs": 39}, "the training pairs"),
    ],
)
def test_a_resume_with_other_batches_is_refused_naming_the_option_unless_the_epoch_restarts(tmp_path, change, option):
    resumable_run(tmp_path).train()
    assert read_train_state(tmp_path / "checkpoint-2")["batching"]["pairs_done"] > 0
    changed = resumable_run(tmp_path, max_steps=3, **change)
    with pytest.raises(
        ValueError, match=f"checkpoint-2 was trained with {option}.*--ignore_data_skip true"
    ) as refused:
        changed.train(resume_from_checkpoint=True)
    assert "\n" not in str(refused.value)
    restarted = resumable_run(tmp_path, max_steps=3, ignore_data_skip=True, **change)
    restarted.train(resume_from_checkpoint=True)
    assert restarted.state.global_step == 3
    same = resumable_run(tmp_path, max_steps=4)
    same.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))  # the same batches: resumed
    assert same.state.global_step == 4


def test_a_resume_with_another_cpu_processes_count_is_refused_naming_it(tmp_path, monkeypatch):
    """`cpu_processes: 2` ran the checkpoint as 2 processes of 40 tokens a batch (the launcher's --max_tokens 80 // 2);
    one process of the whole 80 resumes it: refused in one line naming cpu_processes, never the --max_tokens the user
    did not set."""
    from hf_vanilla.training.launcher import CPU_PROCESSES_VARIABLE

    monkeypatch.setenv(CPU_PROCESSES_VARIABLE, "2")
    resumable_run(tmp_path).train()
    monkeypatch.delenv(CPU_PROCESSES_VARIABLE)
    with pytest.raises(ValueError, match="trained with cpu_processes 2 .* this run has cpu_processes 1") as refused:
        resumable_run(tmp_path, max_tokens=80, max_steps=3).train(resume_from_checkpoint=True)
    assert "--max_tokens" not in str(refused.value) and "\n" not in str(refused.value)


def test_a_resume_with_other_accumulation_goes_on_in_the_global_order_and_says_how_updates_changed(tmp_path, caplog):
    resumable_run(tmp_path).train()  # 2 updates of 1 batch
    resumed = resumable_run(tmp_path, max_steps=3, gradient_accumulation_steps=2)
    with caplog.at_level(logging.WARNING, logger="hf_vanilla.training.trainer"):
        resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3
    assert "An update now takes 2 batches (1 process(es) x 2 accumulation step(s), up to 80 tokens)" in caplog.text
    # 2 batches, then 2 more in the third update: the first 4 of epoch 0's global order
    saved = read_train_state(tmp_path / "checkpoint-3")["batching"]
    lengths = [len(row) for row in resumed.train_dataset["input_ids"]]
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=40, seed=3)
    assert (saved["epoch"], saved["pairs_done"]) == (0, sum(len(batch) for batch in list(sampler)[:4]))


def test_a_pair_over_the_budget_is_an_error():
    with pytest.raises(ValueError, match="max_tokens"):
        TokenBudgetBatchSampler([5, 300], max_tokens=256)


# Metric


HYPOTHESES = ["Ein Mann läuft über die Straße .", "Zwei Kinder spielen im Park.", "Eine Frau singt."]
REFERENCES = ["Ein Mann geht über die Straße.", "Zwei Kinder spielen im Park.", "Eine Frau singt ein Lied."]


@pytest.mark.parametrize("tokenize, lowercase", [("13a", False), ("none", True)])
def test_metric_equals_sacrebleu(tokenize, lowercase):
    scores = TranslationMetric(tokenize=tokenize, lowercase=lowercase).compute(
        predictions=HYPOTHESES, references=[[r] for r in REFERENCES]
    )
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], tokenize=tokenize, lowercase=lowercase)
    assert scores["bleu"] == pytest.approx(expected.score)
    expected_chrf = sacrebleu.metrics.CHRF(lowercase=lowercase).corpus_score(HYPOTHESES, [REFERENCES])
    assert scores["chrf"] == pytest.approx(expected_chrf.score, abs=1e-9)
    assert f"tok:{tokenize}" in scores["bleu_signature"]
    # an offline drop-in for evaluate.load("sacrebleu"): its keys, its values
    assert scores["score"] == pytest.approx(expected.score)
    assert (scores["counts"], scores["totals"]) == (expected.counts, expected.totals)
    assert scores["precisions"] == pytest.approx(expected.precisions)
    assert (scores["bp"], scores["sys_len"], scores["ref_len"]) == (expected.bp, expected.sys_len, expected.ref_len)


@pytest.mark.parametrize("tokenize, warned", [("13a", True), ("none", False)])
def test_only_scores_of_detokenised_text_warn_of_tokenised_text(tokenize, warned, caplog):
    """sacreBLEU warns where 100 lines end in a spaced-off period: useful for raw text, noise for `tokenize="none"`,
    which scores Moses-tokenised text by intent (at every evaluation of the published recipe)."""
    tokenised = ["ein mann läuft über die straße ."] * 120
    TranslationMetric(tokenize=tokenize).compute(predictions=tokenised, references=[[line] for line in tokenised])
    assert ("forgot to detokenize" in caplog.text) == warned


def test_compute_metrics_maps_minus_100_to_padding(small_tokenizer):
    tokenizer = small_tokenizer
    encoded = tokenizer(HYPOTHESES, padding=True)["input_ids"]
    labels = tokenizer(REFERENCES, padding=True)["input_ids"]
    predictions = np.array(encoded)
    label_ids = np.array(labels)
    predictions = np.pad(predictions, ((0, 0), (0, 3)), constant_values=-100)  # padding between eval batches
    label_ids = np.where(label_ids == tokenizer.pad_token_id, -100, label_ids)
    metrics = build_compute_metrics(tokenizer, TranslationMetric())(EvalPrediction(predictions, label_ids))
    assert metrics["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score)


# Checkpoint averaging


def test_averaging_two_checkpoints_is_the_elementwise_mean(tmp_path):
    first, second = make_model(seed=1), make_model(seed=2)
    first.save_pretrained(tmp_path / "checkpoint-10")
    second.save_pretrained(tmp_path / "checkpoint-20")
    assert [p.name for p in checkpoint_folders(tmp_path)] == ["checkpoint-10", "checkpoint-20"]
    averaged = average_checkpoints(checkpoint_folders(tmp_path))
    expected = {k: (v + second.state_dict()[k]) / 2 for k, v in first.state_dict().items()}
    for name, tensor in averaged.state_dict().items():
        assert torch.allclose(tensor, expected[name], atol=1e-7), name
    encoder, decoder = averaged.model.encoder.embed_tokens.weight, averaged.model.decoder.embed_tokens.weight
    assert encoder is decoder is averaged.lm_head.weight  # shared and tied weights stay tied
    averaged.save_pretrained(tmp_path / "averaged")
    stored = load_file(tmp_path / "averaged" / "model.safetensors")
    assert torch.allclose(stored["model.encoder.embed_tokens.weight"], expected["model.encoder.embed_tokens.weight"])


def test_average_command_writes_a_loadable_folder(tmp_path):
    import subprocess
    import sys

    from transformers import AutoModelForSeq2SeqLM

    for step, seed in ((5, 1), (10, 2), (15, 3)):
        make_model(seed=seed).save_pretrained(tmp_path / f"checkpoint-{step}")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_vanilla",
            "average",
            "--from",
            str(tmp_path),
            "--last",
            "2",
            "--output",
            str(tmp_path / "avg"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "averaged 2 checkpoints" in result.stdout
    averaged = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg")
    expected = (make_model(seed=2).lm_head.weight + make_model(seed=3).lm_head.weight) / 2
    assert torch.allclose(averaged.lm_head.weight, expected, atol=1e-7)


def test_averaging_the_last_0_checkpoints_averages_none(tmp_path, capsys):
    from hf_vanilla.commands import main
    from hf_vanilla.training.averaging import last_checkpoints

    for step in (5, 10):
        make_model(seed=step).save_pretrained(tmp_path / f"checkpoint-{step}")
    assert last_checkpoints(tmp_path, 0) == [] and len(last_checkpoints(tmp_path, 1)) == 1
    with pytest.raises(SystemExit):
        main(["average", "--from", str(tmp_path), "--last", "0", "--output", str(tmp_path / "avg")])
    assert f"--last 0: average at least 1 checkpoint of {tmp_path}" in capsys.readouterr().err
    assert not (tmp_path / "avg").exists()


def test_averaging_refuses_different_models(tmp_path):
    make_model().save_pretrained(tmp_path / "a")
    make_model(decoder_layers=1).save_pretrained(tmp_path / "b")
    with pytest.raises(ValueError, match="different weights"):
        average_state_dicts([tmp_path / "a", tmp_path / "b"])
