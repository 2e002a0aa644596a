"""`Seq2SeqTrainer` with token-budget batches, the chunked training loss and a generation config that evaluation
leaves as it found it."""

import copy

from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase, Seq2SeqTrainer

from ..pipeline_vanilla import check_tokenizer_matches_model
from .batching import TokenBudgetBatchSampler


class TokenBudgetSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` whose training batches come from a `TokenBudgetBatchSampler`."""

    def __init__(self, *args, max_tokens: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens = max_tokens
        if isinstance(self.processing_class, PreTrainedTokenizerBase):
            check_tokenizer_matches_model(self.processing_class, self.model.config)

    def get_train_dataloader(self) -> DataLoader:
        dataset = self.train_dataset
        sampler = TokenBudgetBatchSampler(
            dataset["source_length"], dataset["target_length"], self.max_tokens, seed=self.args.seed
        )
        dataset = self._remove_unused_columns(dataset, description="training")
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        # Accelerate shards the batches across processes: each rank gets every n-th batch.
        return self.accelerator.prepare(loader)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # While training, the model computes the label-smoothed loss itself, a chunk of positions at a time, instead
        # of the library's `LabelSmoother` over the materialised [tokens, vocab] logits: the same loss with the same
        # normalisation (`num_items_in_batch`), without the largest tensor of a small model's step.
        if not (model.training and self.label_smoother is not None and "labels" in inputs):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = {**inputs, "label_smoothing": self.label_smoother.epsilon, "skip_logits": not return_outputs}
        smoother, self.label_smoother = self.label_smoother, None  # the model smooths, so the library must not
        try:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self.label_smoother = smoother

    def prediction_step(self, *args, **kwargs):
        # Seq2SeqTrainer fills every library default into `model.generation_config` (max_length=20 among them),
        # which checkpoints would then save and every later `generate(max_new_tokens=...)` would warn about.
        generation_config = copy.deepcopy(self.model.generation_config)
        try:
            return super().prediction_step(*args, **kwargs)
        finally:
            self.model.generation_config = generation_config
