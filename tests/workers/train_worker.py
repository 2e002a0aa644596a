"""Trains a tiny model a few steps with the project's trainer; run directly or under `accelerate launch`.

Writes `<output_dir>/rank<r>.json`: the batches this rank saw (as id tuples) and a digest of its final weights.
With `--kill-at N` the process SIGKILLs itself after update N (a crash, not a clean stop); with `--terminate-at N`
it sends itself SIGTERM there (a preemption: the trainer saves a checkpoint at N and stops); with
`--kill-while-saving N` it SIGKILLs itself in the middle of writing checkpoint N, after the model weights and
before the optimizer and trainer state. With `--replay FILE` it trains on the micro-batches listed there (lists of
source id sequences), in that order, instead of the token-budget sampler's; `--save-weights` also writes
`rank<r>.safetensors`.
"""

import argparse
import hashlib
import json
import os
import signal
from pathlib import Path

import torch
from datasets import Dataset
from safetensors.torch import save_file
from torch.utils.data import DataLoader
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments, TrainerCallback

from benchmarks.synthetic import word_level_tokenizer
from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla.training import TokenBudgetSeq2SeqTrainer
from hf_vanilla.training.callbacks import StopOnSigtermCallback


class RecordingCollator(DataCollatorForSeq2Seq):
    seen: list = []

    def __call__(self, features, return_tensors=None):
        batch = super().__call__(features, return_tensors)
        RecordingCollator.seen.append(
            [
                row[: int(mask.sum())].tolist()
                for row, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)
            ]
        )
        return batch


class SignalAt(TrainerCallback):
    def __init__(self, step: int, signal_number: int):
        self.step, self.signal_number = step, signal_number

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), self.signal_number)


def kill_while_saving(trainer: TokenBudgetSeq2SeqTrainer, step: int) -> None:
    """SIGKILL the process when the checkpoint of `step` has its weights on disk but not yet its optimizer state."""
    save_optimizer_and_scheduler = trainer._save_optimizer_and_scheduler

    def save_or_die(output_dir: str) -> None:
        if trainer.state.global_step == step:
            assert Path(output_dir, "model.safetensors").exists()  # the kill really lands inside the save
            os.kill(os.getpid(), signal.SIGKILL)
        save_optimizer_and_scheduler(output_dir)

    trainer._save_optimizer_and_scheduler = save_or_die


class ReplayingTrainer(TokenBudgetSeq2SeqTrainer):
    """Trains on given micro-batches (each a list of dataset rows), in the given order."""

    def __init__(self, *args, batches: list[list[int]], **kwargs):
        super().__init__(*args, **kwargs)
        self.batches = batches

    def get_train_dataloader(self) -> DataLoader:
        rows = self.train_dataset.select_columns(["input_ids", "labels"])
        loader = DataLoader(rows, batch_sampler=self.batches, collate_fn=self.data_collator)
        return self.accelerator.prepare(loader)


def rows_of(batches: list[list[list[int]]], dataset: Dataset) -> list[list[int]]:
    """The dataset rows of micro-batches recorded as source id sequences."""
    row_of = {tuple(ids): row for row, ids in enumerate(dataset["input_ids"])}
    return [[row_of[tuple(ids)] for ids in batch] for batch in batches]


def synthetic_pairs(count: int = 160) -> Dataset:
    generator = torch.Generator().manual_seed(0)
    rows = {"input_ids": [], "attention_mask": [], "labels": [], "source_length": [], "target_length": []}
    for _ in range(count):
        length = int(torch.randint(3, 12, (1,), generator=generator))
        body = torch.randint(4, 40, (length,), generator=generator).tolist()
        rows["input_ids"].append(body + [2])
        rows["attention_mask"].append([1] * (length + 1))
        rows["labels"].append(list(reversed(body)) + [2])
        rows["source_length"].append(length + 1)
        rows["target_length"].append(length + 1)
    return Dataset.from_dict(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--epochs", type=int, help="train whole epochs instead of --max-steps updates")
    parser.add_argument("--save-steps", type=int, default=4)
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--terminate-at", type=int)
    parser.add_argument("--kill-while-saving", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--gradient-accumulation", type=int, default=2)
    parser.add_argument("--replay", type=Path, help="a JSON list of micro-batches to train on, in order")
    parser.add_argument("--save-weights", action="store_true")
    options = parser.parse_args()

    torch.manual_seed(0)
    config = VanillaTransformerConfig(
        vocab_size=48,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        dropout=options.dropout,
    )
    model = VanillaTransformerForConditionalGeneration(config)
    args = Seq2SeqTrainingArguments(
        output_dir=options.output_dir,
        max_steps=-1 if options.epochs else options.max_steps,
        num_train_epochs=options.epochs or 3,
        save_steps=options.save_steps,
        save_strategy="steps",
        learning_rate=3e-3,
        lr_scheduler_type="inverse_sqrt",
        warmup_steps=4,
        label_smoothing_factor=0.1,
        adam_beta2=0.98,
        adam_epsilon=1e-9,
        weight_decay=0.0,
        logging_steps=4,
        report_to=[],
        seed=5,
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        gradient_accumulation_steps=options.gradient_accumulation,
    )
    stop_on_sigterm = StopOnSigtermCallback()
    dataset = synthetic_pairs()
    replay = {"batches": rows_of(json.loads(options.replay.read_text()), dataset)} if options.replay else {}
    trainer = (ReplayingTrainer if options.replay else TokenBudgetSeq2SeqTrainer)(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=RecordingCollator(word_level_tokenizer(48), model=model),
        callbacks=[
            *([SignalAt(options.kill_at, signal.SIGKILL)] if options.kill_at else []),
            *([SignalAt(options.terminate_at, signal.SIGTERM)] if options.terminate_at else []),
            stop_on_sigterm,
        ],
        max_tokens=48,
        **replay,
    )
    if options.kill_while_saving:
        kill_while_saving(trainer, options.kill_while_saving)
    trainer.train(resume_from_checkpoint=True if options.resume else None)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().numpy().tobytes())
    rank = trainer.args.process_index
    if options.save_weights:  # copies: the tied embeddings share storage, which safetensors refuses
        weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        save_file(weights, Path(options.output_dir, f"rank{rank}.safetensors"))
    Path(options.output_dir, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "batches": RecordingCollator.seen,
                "dataset": list(dataset["input_ids"]),
                "weights": digest.hexdigest(),
                "step": trainer.state.global_step,
                "epoch": trainer.state.epoch,
                "stopped_by_sigterm_at": stop_on_sigterm.stopped_at,
            }
        )
    )
    # Every rank leaves together and closes its process group itself, as `hf-vanilla train` does: a gloo group left to
    # the interpreter's teardown aborted a rank of a four-process run after its record was written (SIGABRT, in CI).
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()


if __name__ == "__main__":
    main()
