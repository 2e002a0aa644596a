"""The paper's training recipe on `Seq2SeqTrainer`: arguments, batching, metrics, callbacks, the trainer, the run."""

from .arguments import RecipeArguments, parse_arguments
from .batching import TokenBudgetBatchSampler
from .metrics import TranslationMetric, build_compute_metrics
from .recipe import TrainingInterrupted, run_training
from .trainer import TokenBudgetSeq2SeqTrainer


__all__ = [
    "RecipeArguments",
    "TokenBudgetBatchSampler",
    "TokenBudgetSeq2SeqTrainer",
    "TrainingInterrupted",
    "TranslationMetric",
    "build_compute_metrics",
    "parse_arguments",
    "run_training",
]
