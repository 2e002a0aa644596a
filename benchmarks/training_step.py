"""The training step, ours against MarianMT configured identically, through the Trainer's real path.

Both models train on the same token-budget batches of Multi30k (a joint BPE of 8000 entries, `--max_tokens` 2048,
the quickstart's), each through a `TokenBudgetSeq2SeqTrainer` with the main job's settings: label smoothing 0.1 (our
model's own chunked loss; Marian's through the library's `LabelSmoother`), dropout 0.1, gradient clipping, AdamW and
the inverse-square-root schedule. A step is what the Trainer's loop does for one update: `get_batch_samples`,
`training_step` (forward and backward), `clip_grad_norm_`, the optimizer and scheduler steps, `zero_grad`.

Calls alternate (ours, Marian, ours, ...) after a warm-up, each call the same `--batches` batches in the same order,
so machine noise hits both alike; the ratio is Marian's median seconds over ours (above 1: ours is faster). Each
model's GFLOP/s (`torch.utils.flop_counter` over one call) is set against the machine's float32 matmul rate on the
same threads, and `torch.profiler` gives the share of our step each operator takes. `--compile` adds, for each shape,
a run with the Trainer's `torch_compile` on for both models, which Accelerate's `prepare_model` applies (Inductor,
shapes made dynamic after the first recompile), right after the eager one; the first call, which compiles, is timed
on its own.

    python -m benchmarks.training_step --shape quickstart --threads 2 --json docs/results/training-step-cpu.json
"""

import argparse
import itertools
import json
import statistics
import tempfile
from collections.abc import Callable

import torch
import yaml
from datasets import Dataset
from transformers import PreTrainedTokenizerBase, Seq2SeqTrainingArguments

from benchmarks import ROOT, markdown, record
from benchmarks.benchmark import alternate, timed
from benchmarks.synthetic import build_models
from hf_vanilla.text_files import stream_lines
from hf_vanilla.tokenization import train_bpe_tokenizer
from hf_vanilla.training import TokenBudgetSeq2SeqTrainer
from hf_vanilla.training.arguments import parse_arguments
from hf_vanilla.training.recipe import seq2seq_collator


MULTI30K = ROOT / "hf_vanilla" / "corpora" / "multi30k"
QUICKSTART = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
QUICKSTART_MODEL = json.loads((ROOT / QUICKSTART["model_config"]).read_text())
# The models' shapes: the main job's and the paper's base; the vocabulary is the BPE's.
SHAPES = {
    "quickstart": dict(
        d_model=QUICKSTART_MODEL["d_model"],
        layers=QUICKSTART_MODEL["encoder_layers"],
        heads=QUICKSTART_MODEL["encoder_attention_heads"],
        ffn=QUICKSTART_MODEL["encoder_ffn_dim"],
    ),
    "base": dict(d_model=512, layers=6, heads=8, ffn=2048),
}
# The main job's settings that decide what an update computes, as the train command reads configs/quickstart.yaml
# (its `lr_scheduler_type: budget` is the budget schedule's name, which the command turns into the Trainer's).
RECIPE_KEYS = ["label_smoothing_factor", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps"]
RECIPE_KEYS += ["weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "seed", "dataloader_num_workers"]
_, QUICKSTART_ARGUMENTS = parse_arguments(["--config", str(ROOT / "configs" / "quickstart.yaml")])
RECIPE = {key: getattr(QUICKSTART_ARGUMENTS, key) for key in RECIPE_KEYS}
VOCAB_SIZE, MAX_TOKENS = QUICKSTART["vocab_size"], QUICKSTART["max_tokens"]


def multi30k_pairs(tokenizer, pairs: int) -> Dataset:
    """The first `pairs` Multi30k training pairs, tokenized as the recipe stores them."""
    sources = list(itertools.islice(stream_lines(MULTI30K / "train.en.gz"), pairs))
    targets = list(itertools.islice(stream_lines(MULTI30K / "train.de.gz"), pairs))
    encoded = tokenizer(sources, text_target=targets)
    return Dataset.from_dict(
        {
            "input_ids": encoded["input_ids"],
            "labels": encoded["labels"],
            "source_length": [len(ids) for ids in encoded["input_ids"]],
            "target_length": [len(ids) for ids in encoded["labels"]],
        }
    )


def trainer_for(
    model, tokenizer, dataset: Dataset, args: Seq2SeqTrainingArguments, **options
) -> TokenBudgetSeq2SeqTrainer:
    """The main job's trainer for `model`; `options` are further `TokenBudgetSeq2SeqTrainer` arguments."""
    return TokenBudgetSeq2SeqTrainer(
        model=model.train(),
        args=args,
        train_dataset=dataset,
        data_collator=seq2seq_collator(tokenizer, model, args),
        max_tokens=MAX_TOKENS,
        measure_source_use=False,
        **options,
    )


def update_steps(trainer: TokenBudgetSeq2SeqTrainer, batches: list[dict]) -> Callable[[], list[float]]:
    """One call: an update on each of `batches`, as the Trainer's loop makes it; returns the losses. The model is
    what the Trainer trains: Accelerate's `prepare_model` of it (compiled where the arguments ask for it)."""
    trainer.create_optimizer_and_scheduler(num_training_steps=10**6)
    model, args = trainer.accelerator.prepare_model(trainer.model), trainer.args

    def run() -> list[float]:
        losses = []
        for batch in batches:
            samples, items = trainer.get_batch_samples(iter([batch]), 1, args.device)
            losses.append(trainer.training_step(model, samples[0], items).item())
            trainer.accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            trainer.optimizer.step()
            trainer.lr_scheduler.step()
            model.zero_grad()
        return losses

    return run


def matmul_gflops(threads: int, size: int = 2048, repeats: int = 5) -> float:
    """The best float32 matmul rate of `repeats` on this machine's `threads`: the step's ceiling."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = min(timed(lambda: a @ b, "cpu") for _ in range(repeats))
    return 2 * size**3 / best / 1e9


def flops_of(fn: Callable[[], None]) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def operator_shares(fn: Callable[[], None], rows: int = 12) -> list[dict]:
    """The operators that take the most of one call's own CPU time, with their share of the whole and call counts."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        fn()
    events = [event for event in profiler.key_averages() if event.self_cpu_time_total > 0]
    total = sum(event.self_cpu_time_total for event in events)
    events.sort(key=lambda event: -event.self_cpu_time_total)
    return [
        {"op": event.key, "share": event.self_cpu_time_total / total, "calls": event.count} for event in events[:rows]
    ]


def main_job_setting(shape: str, threads: int) -> tuple[PreTrainedTokenizerBase, dict[str, torch.nn.Module], Dataset]:
    """torch on `threads`; the main job's BPE of Multi30k's training text (both sides); ours and Marian of `shape`
    over it, freshly initialised; and the first 4000 training pairs tokenized, where the benchmarks' batches come
    from."""
    torch.set_num_threads(threads)
    sources = list(stream_lines(MULTI30K / "train.en.gz")) + list(stream_lines(MULTI30K / "train.de.gz"))
    tokenizer = train_bpe_tokenizer(sources, VOCAB_SIZE, show_progress=False)
    models = build_models({**SHAPES[shape], "vocab": len(tokenizer)}, "cpu", torch.float32)
    return tokenizer, models, multi30k_pairs(tokenizer, pairs=4000)


def run(shape: str, threads: int, repeats: int, batches: int, optim: str, compile_models: bool = False) -> dict:
    tokenizer, models, dataset = main_job_setting(shape, threads)
    steps, flops, first_call = {}, {}, {}
    with tempfile.TemporaryDirectory() as output:
        args = Seq2SeqTrainingArguments(
            output_dir=output, use_cpu=True, report_to=[], optim=optim, torch_compile=compile_models, **RECIPE
        )
        trainers = {name: trainer_for(model, tokenizer, dataset, args) for name, model in models.items()}
        # the same batches for both: our loader's first ones (the collators agree: both start decoding from id 1)
        chosen = list(itertools.islice(trainers["ours"].get_train_dataloader(), batches))
        for name, trainer in trainers.items():
            steps[name] = update_steps(trainer, chosen)
            first_call[name] = timed(steps[name], "cpu")  # compiling, where asked: before the flop counter's call
            flops[name] = flops_of(steps[name])
        seconds = alternate(steps, repeats, "cpu", warm_up=False)  # two calls each above
        shares = operator_shares(steps["ours"])
    peak = matmul_gflops(threads)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    target_tokens = sum(int(batch["labels"].ne(-100).sum()) for batch in chosen)
    return {
        "shape": {**SHAPES[shape], "vocab": len(tokenizer)},
        "parameters": {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()},
        "batches": batches,
        "target_tokens_per_call": target_tokens,
        "optim": optim,
        "torch_compile": compile_models,
        "first_call_seconds": first_call,
        "threads": threads,
        "repeats": repeats,
        "torch": torch.__version__,
        "seconds_per_update": {
            name: {"median": median[name] / batches, "all": [s / batches for s in values]}
            for name, values in seconds.items()
        },
        "speedup_over_marian": median["marian"] / median["ours"],
        "gflop_per_update": {name: flops[name] / batches / 1e9 for name in flops},
        "gflops": {name: flops[name] / median[name] / 1e9 for name in flops},
        "matmul_peak_gflops": peak,
        "share_of_peak": {name: flops[name] / median[name] / 1e9 / peak for name in flops},
        "ours_operator_shares": shares,
    }


def compiled(result: dict) -> str:
    """The optimizer cell's suffix for a compiled run: torch.compile and each model's first call (which compiles)."""
    if not result.get("torch_compile"):
        return ""
    first = result["first_call_seconds"]
    return f", torch.compile (first call {first['ours']:.0f} s, Marian {first['marian']:.0f} s)"


def table(results: list[dict]) -> str:
    rows = [
        [
            result["shape_name"],
            result["optim"] + compiled(result),
            f"{1000 * result['seconds_per_update']['ours']['median']:.0f}",
            f"{1000 * result['seconds_per_update']['marian']['median']:.0f}",
            f"{result['speedup_over_marian']:.2f}x",
            f"{result['gflops']['ours']:.0f} ({100 * result['share_of_peak']['ours']:.0f}%)",
        ]
        for result in results
    ]
    header = ["shape", "optimizer", "ours ms/update", "Marian ms/update", "Marian / ours", "ours GFLOP/s (of peak)"]
    return markdown(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=SHAPES, nargs="+", default=["quickstart"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=10, help="updates per timed call")
    parser.add_argument("--optim", default=QUICKSTART["optim"], help="the Trainer's optimizer, for both models")
    parser.add_argument("--compile", action="store_true", help="also with the Trainer's torch_compile (both models)")
    parser.add_argument("--json", help="write the results here (docs/results/...)")
    args = parser.parse_args()
    results = []
    for shape, compile_models in itertools.product(args.shape, [False, True] if args.compile else [False]):
        print(f"{shape}{', compiled' if compile_models else ''}: ...", flush=True)
        results.append(
            {"shape_name": shape, **run(shape, args.threads, args.repeats, args.batches, args.optim, compile_models)}
        )
    print(table(results))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(record("benchmarks.training_step", results), handle, indent=1)
            handle.write("\n")


if __name__ == "__main__":
    main()
