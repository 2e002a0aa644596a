"""The command-line surface of a training run: the recipe's own options plus every `Seq2SeqTrainingArguments` field,
with a YAML file for defaults."""

import argparse
import logging
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch
from transformers import HfArgumentParser, Seq2SeqTrainingArguments
from transformers.hf_argparser import string_to_bool

from ..data import BUNDLED_CORPORA
from .batching import refuse_split_batches
from .budget import BUDGET_SCHEDULE, budget_schedule_arguments


logger = logging.getLogger(__name__)


def choice(choices: list[str], help: str):
    """An option that takes one of `choices` (the command line refuses others), the first by default."""
    return field(default=choices[0], metadata={"help": help, "choices": choices})


@dataclass
class RecipeArguments:
    """What a translation run needs beyond `Seq2SeqTrainingArguments`; every field is a command-line option."""

    data: str = field(
        default="multi30k",
        metadata={
            "help": f"a corpus shipped with hf_vanilla ({', '.join(BUNDLED_CORPORA)}); a folder of aligned text files "
            "({split}.{lang}[.gz]), of TSV pairs ({split}.tsv[.gz]), of JSON lines / parquet / arrow / CSV files, or "
            "from save_to_disk; or a dataset repository, local or a Hub id such as wmt14 (with --data_config)"
        },
    )
    data_config: str | None = field(
        default=None, metadata={"help": "config name of a dataset repository, e.g. de-en for wmt14"}
    )
    data_pattern: str | None = field(
        default=None, metadata={"help": "file name pattern inside a `data` folder (default: {split}.{lang})"}
    )
    train_file: str | None = field(
        default=None,
        metadata={"help": "instead of --data: a training file (.tsv, .json[l], .parquet, .arrow, .csv; .gz too)"},
    )
    validation_file: str | None = field(default=None, metadata={"help": "with --train_file: the validation file"})
    test_file: str | None = field(default=None, metadata={"help": "with --train_file: the test file"})
    data_cache_dir: str | None = field(
        default=None,
        metadata={"help": "cache of tokenizers and tokenized corpora (default: <HF_DATASETS_CACHE>/hf_vanilla)"},
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "processes that tokenize the corpus (default: one per CPU core)"}
    )
    source_language: str = "en"
    target_language: str = "de"
    max_train_examples: int | None = field(default=None, metadata={"help": "use only the first N training pairs"})
    max_eval_examples: int | None = field(default=None, metadata={"help": "use only the first N validation pairs"})
    max_test_examples: int | None = field(default=None, metadata={"help": "use only the first N test pairs"})
    model_config: str = field(default="configs/tiny.json", metadata={"help": "model preset (JSON)"})
    tokenizer: str | None = field(default=None, metadata={"help": "trained tokenizer folder; trained if not given"})
    vocab_size: int = field(default=10000, metadata={"help": "size of the BPE vocabulary to train"})
    tokenizer_sample: int = field(
        default=2_000_000,
        metadata={"help": "the BPE learns from about this many sentences drawn from the training pairs (both sides)"},
    )
    max_length: int = field(default=256, metadata={"help": "training pairs longer (in tokens) are dropped, counted"})
    max_tokens: int = field(default=4096, metadata={"help": "tokens per batch including padding (per process)"})
    cpu_processes: int = field(
        default=1,
        metadata={
            "help": "without a launcher or an accelerator, train as this many data-parallel processes on this host "
            "(at most one per core), each with max_tokens / N tokens a batch: the same updates, more of them a "
            "minute where one process leaves cores idle"
        },
    )
    lr_scale: float | None = field(
        default=None,
        metadata={"help": "set the peak learning rate by the paper's formula: scale * d_model^-0.5 * warmup^-0.5"},
    )
    muon: bool = field(
        default=False,
        metadata={
            "help": "train the layers' 2-D weight matrices with Muon (torch.optim.Muon, updates scaled to AdamW's), "
            "the embeddings, norms and biases with AdamW: one learning rate, schedule, weight decay, betas and "
            "epsilon (the training arguments') for both; optim is then not used"
        },
    )
    average_last: int = field(default=0, metadata={"help": "average the last N checkpoints at the end (0: off)"})
    final_weights: str = choice(
        ["better", "averaged"],
        "with --average_last: 'better' keeps the better of the average and the last weights by validation BLEU; "
        "'averaged' keeps the average, as fairseq's checkpoint averaging is used",
    )
    final_choice_decoding: str = choice(
        ["evaluation", "test"],
        "how the validation split is translated to choose the final weights: 'evaluation' as the run's evaluations "
        "(generation_num_beams), 'test' as the test split (test_num_beams, test_length_penalty)",
    )
    early_stopping_patience: int | None = field(default=None, metadata={"help": "evaluations without BLEU gain"})
    max_train_minutes: float | None = field(
        default=None,
        metadata={
            "help": "stop training after this wall time (evaluations included, summed over resumes); "
            "lr_scheduler_type budget then decays the learning rate to it"
        },
    )
    dropout_min_epochs: float | None = field(
        default=None,
        metadata={
            "help": "keep the model's dropout only if the budget (max_train_minutes, max_steps) buys at least this "
            "many epochs, judged at the end of warmup; a shorter run trains without it (it underfits: dropout only "
            "slows it)"
        },
    )
    detect_source_neglect: bool = field(
        default=True,
        metadata={"help": "measure eval_source_use at every evaluation and warn when the model ignores its source"},
    )
    bleu_tokenize: str = field(default="13a", metadata={"help": "sacreBLEU tokenizer; 'none' for pre-tokenized"})
    bleu_lowercase: bool = False
    test_num_beams: int = field(default=4, metadata={"help": "beam size for the final test evaluation"})
    test_length_penalty: float | None = field(
        default=None, metadata={"help": "length penalty of the test's beam search (default: the model's, 0.6)"}
    )
    extra_target_tokens: int = field(default=50, metadata={"help": "generation budget: longest source + this"})
    translate_examples: int = field(default=3, metadata={"help": "test sentences printed with translations"})

    def data_files(self) -> dict[str, str] | None:
        """The named split files, when given instead of `data`."""
        files = {"train": self.train_file, "validation": self.validation_file, "test": self.test_file}
        return {split: path for split, path in files.items() if path} or None


def paper_learning_rate(scale: float, d_model: int, warmup_steps: int) -> float:
    """§5.3: the peak of lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), reached at `warmup_steps`."""
    return scale * d_model**-0.5 * max(warmup_steps, 1) ** -0.5


def with_paper_learning_rate(
    training_args: Seq2SeqTrainingArguments, lr_scale: float | None, d_model: int
) -> Seq2SeqTrainingArguments:
    """The arguments with `learning_rate` set by `paper_learning_rate` when `--lr_scale` is given (else unchanged)."""
    if lr_scale is None:
        return training_args
    return replace(training_args, learning_rate=paper_learning_rate(lr_scale, d_model, training_args.warmup_steps))


def resume_point(value: str | None) -> str | bool | None:
    """`--resume_from_checkpoint last` (or `true`) resumes from the newest checkpoint; any other value is a path."""
    if isinstance(value, str) and value.lower() in {"last", "true"}:
        return True
    return value


def option_names(parser: HfArgumentParser) -> set[str]:
    """Every option the parser reads: the fields of its dataclasses (each is `--name`, and a recipe YAML key)."""
    return {option.name for arguments in parser.dataclass_types for option in fields(arguments) if option.init}


def parse_arguments(argv: list[str] | None = None) -> tuple[RecipeArguments, Seq2SeqTrainingArguments]:
    """`--config recipe.yaml` supplies defaults; every recipe or `Seq2SeqTrainingArguments` field can override."""
    import yaml

    # The options read before the main parser: the recipe file, `--bf16`, whose values include `auto` (a bool field
    # of `Seq2SeqTrainingArguments` otherwise), and `--lr_scheduler_type`, whose values include `budget` (the
    # library's names otherwise). Read here, in every spelling argparse accepts (`--bf16 auto`, `--bf16=auto`, a bare
    # `--bf16`), they become defaults that the recipe's own values do not override.
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument("--bf16", type=bf16_option, nargs="?", const=True)
    pre.add_argument("--lr_scheduler_type")
    known, rest = pre.parse_known_args(argv)
    parser = HfArgumentParser(
        (RecipeArguments, Seq2SeqTrainingArguments),
        prog="hf-vanilla train",
        description="Train a translation model. --config RECIPE.yaml sets defaults for every option below.",
    )
    if known.config:
        values = yaml.safe_load(Path(known.config).read_text()) or {}
        unknown = set(values) - option_names(parser)
        if unknown:
            raise ValueError(f"{known.config}: unknown keys {sorted(unknown)}; see `hf-vanilla train --help`.")
        if "bf16" in values:
            values["bf16"] = bf16_option(values["bf16"])
        parser.set_defaults(**values)
    if known.bf16 is not None:
        parser.set_defaults(bf16=known.bf16)
    schedule = known.lr_scheduler_type or parser.get_default("lr_scheduler_type")
    if schedule == BUDGET_SCHEDULE:
        parser.set_defaults(lr_scheduler_type=budget_schedule_arguments()["lr_scheduler_type"])
    elif known.lr_scheduler_type:
        parser.set_defaults(lr_scheduler_type=known.lr_scheduler_type)
    processes = launched_processes()
    cpu_only = not torch.accelerator.is_available()
    if cpu_only:
        # Without an accelerator the device is the CPU whatever `use_cpu` says, but transformers asks for it before
        # it goes distributed (without it each process of a torchrun/srun launch trains alone on the whole corpus,
        # N independent jobs writing one folder) and before it allows bf16, which `bf16: auto` picks on CPUs with
        # AVX512-BF16 or AMX ("Your setup doesn't support bf16/gpu. You need to assign use_cpu").
        parser.set_defaults(use_cpu=True)
    recipe, training_args = parser.parse_args_into_dataclasses(args=rest, look_for_args_file=False)
    if schedule == BUDGET_SCHEDULE:  # the marker the trainer reads, beside the kwargs the recipe or the command gave
        training_args.lr_scheduler_kwargs = budget_schedule_arguments(training_args.lr_scheduler_kwargs)[
            "lr_scheduler_kwargs"
        ]
    refuse_split_batches(training_args.accelerator_config.split_batches)  # before the corpus is read
    if cpu_only and processes > 1 and not training_args.use_cpu:
        raise ValueError(
            f"Launched as {processes} processes on hosts without a GPU, but --use_cpu false: each would train alone. "
            "Drop --use_cpu false (the processes then train as one job on the CPU)."
        )
    return recipe, training_args


def bf16_hardware() -> str | None:
    """What computes bf16 natively here (a CUDA GPU that supports it, or a CPU with AVX512-BF16 or AMX), or None."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name() if torch.cuda.is_bf16_supported() else None
    cpuinfo = Path("/proc/cpuinfo")
    flags = set(cpuinfo.read_text().split()) if cpuinfo.exists() else set()
    found = [name for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16")) if flag in flags]
    return f"a CPU with {' and '.join(found)}" if found else None


def bf16_option(value: str | bool) -> bool:
    """The value of `--bf16` (or a recipe's `bf16:`): a boolean as transformers spells them, or `auto`."""
    if isinstance(value, bool):
        return value
    if str(value).lower() == "auto":
        return resolve_bf16_auto()
    try:
        return string_to_bool(str(value))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"--bf16 takes true, false or auto, got {value!r}.") from None


def resolve_bf16_auto() -> bool:
    """`bf16: auto` (in a recipe, or `--bf16 auto`): bf16 autocast where the hardware computes it natively."""
    hardware = bf16_hardware()
    logger.warning("bf16: auto -> %s (%s)", hardware is not None, hardware or "no native bf16 here")
    return hardware is not None


def launched_processes() -> int:
    """How many processes the launcher (torchrun, srun through torchrun, accelerate launch) started: its WORLD_SIZE."""
    return int(os.environ.get("WORLD_SIZE", "1"))
