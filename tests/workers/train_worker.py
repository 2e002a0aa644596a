"""Trains a tiny model a few steps with the project's trainer; run directly or under `accelerate launch`.

Writes `<output_dir>/rank<r>.json`: the batches this rank saw (as id tuples) and a digest of its final weights.
With `--kill-at N` the process SIGKILLs itself after update N (a crash, not a clean stop); with `--terminate-at N`
it sends itself SIGTERM there (a preemption: the trainer saves a checkpoint at N and stops); with
`--kill-while-saving N` it SIGKILLs itself in the middle of writing checkpoint N, after the model weights and
before the optimizer and trainer state.
"""

import argparse
import hashlib
import json
import os
import signal
from pathlib import Path

import torch
from datasets import Dataset
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
        dropout=0.2,
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
        gradient_accumulation_steps=2,
    )
    stop_on_sigterm = StopOnSigtermCallback()
    trainer = TokenBudgetSeq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=synthetic_pairs(),
        data_collator=RecordingCollator(word_level_tokenizer(48), model=model),
        callbacks=[
            *([SignalAt(options.kill_at, signal.SIGKILL)] if options.kill_at else []),
            *([SignalAt(options.terminate_at, signal.SIGTERM)] if options.terminate_at else []),
            stop_on_sigterm,
        ],
        max_tokens=48,
    )
    if options.kill_while_saving:
        kill_while_saving(trainer, options.kill_while_saving)
    trainer.train(resume_from_checkpoint=True if options.resume else None)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().numpy().tobytes())
    rank = trainer.args.process_index
    Path(options.output_dir, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "batches": RecordingCollator.seen,
                "dataset": list(synthetic_pairs()["input_ids"]),
                "weights": digest.hexdigest(),
                "step": trainer.state.global_step,
                "stopped_by_sigterm_at": stop_on_sigterm.stopped_at,
            }
        )
    )


if __name__ == "__main__":
    main()
