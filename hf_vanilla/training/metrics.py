"""Translation metrics that need no download: sacreBLEU's BLEU and chrF as an `evaluate` metric, the
`compute_metrics` hook that feeds it generated ids, and how much a model uses its source."""

from collections.abc import Iterable

import evaluate
import numpy as np
import torch
from torch import nn
from transformers import PreTrainedTokenizerBase


# Teacher-forced inputs of a seq2seq batch; everything else a collator adds (lengths, ids) is not the model's.
MODEL_INPUTS = ("input_ids", "attention_mask", "labels", "decoder_input_ids", "decoder_attention_mask")


class TranslationMetric(evaluate.Metric):
    """Corpus BLEU and chrF with sacreBLEU, as an `evaluate` metric that needs no download (the Hub's
    `evaluate.load("sacrebleu")` fetches a script at run time). Returns BLEU, chrF and their signatures, and the keys
    of the Hub's sacrebleu metric (`score`, `counts`, `totals`, `precisions`, `bp`, `sys_len`, `ref_len`), so it is an
    offline drop-in for it."""

    def __init__(self, tokenize: str = "13a", lowercase: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.tokenize, self.lowercase = tokenize, lowercase

    def _info(self) -> evaluate.MetricInfo:
        import datasets

        return evaluate.MetricInfo(
            description="sacreBLEU corpus BLEU and chrF",
            citation="Post, 2018. A Call for Clarity in Reporting BLEU Scores.",
            inputs_description="predictions: list of strings; references: list of lists of strings",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions: list[str], references: list[list[str]]) -> dict:
        from sacrebleu.metrics import BLEU, CHRF

        streams = [list(stream) for stream in zip(*references, strict=True)]
        # `tokenize="none"` scores text tokenised already (Moses-tokenised references), so sacreBLEU's warning that
        # the text looks tokenised, repeated at every evaluation, says nothing; the score and signature are the same
        bleu = BLEU(tokenize=self.tokenize, lowercase=self.lowercase, force=self.tokenize == "none")
        chrf = CHRF(lowercase=self.lowercase)
        bleu_score, chrf_score = bleu.corpus_score(predictions, streams), chrf.corpus_score(predictions, streams)
        return {
            "bleu": bleu_score.score,
            "chrf": chrf_score.score,
            # the keys of the Hub's `evaluate.load("sacrebleu")`, for scripts written against it
            "score": bleu_score.score,
            "counts": bleu_score.counts,
            "totals": bleu_score.totals,
            "precisions": bleu_score.precisions,
            "bp": bleu_score.bp,
            "sys_len": bleu_score.sys_len,
            "ref_len": bleu_score.ref_len,
            "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()),
        }


def decode_padded(tokenizer: PreTrainedTokenizerBase, ids: np.ndarray) -> list[str]:
    """Texts of ids the Trainer gathered: -100 (its padding between batches, and ignored labels) becomes the pad
    token, which decoding skips."""
    return tokenizer.batch_decode(np.where(ids == -100, tokenizer.pad_token_id, ids), skip_special_tokens=True)


def build_compute_metrics(tokenizer: PreTrainedTokenizerBase, metric: TranslationMetric):
    """`compute_metrics` for `predict_with_generate`."""

    def compute_metrics(eval_prediction) -> dict:
        hypotheses = decode_padded(tokenizer, eval_prediction.predictions)
        references = [[text] for text in decode_padded(tokenizer, eval_prediction.label_ids)]
        scores = metric.compute(predictions=hypotheses, references=references)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}  # Trainer logs numbers only

    return compute_metrics


@torch.no_grad()
def source_use_totals(model: nn.Module, batches: Iterable[dict]) -> torch.Tensor:
    """Summed teacher-forced NLL of the target tokens with each row's own source, the same with the sources rolled by
    one row (every target paired with another sentence's source), and the number of target tokens, as a float64
    tensor [3] on the model's device (so that processes can add theirs up). Batches of one row cannot be shuffled
    and are skipped in both sums."""
    device = next(model.parameters()).device
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    for batch in batches:
        batch = {name: batch[name].to(device) for name in MODEL_INPUTS if name in batch}
        if batch["input_ids"].shape[0] < 2:
            continue
        scored = batch["labels"].ne(-100)
        shuffled = {**batch, "input_ids": batch["input_ids"].roll(1, 0)}
        if "attention_mask" in batch:
            shuffled["attention_mask"] = batch["attention_mask"].roll(1, 0)
        tokens = scored.sum()
        for index, inputs in enumerate((batch, shuffled)):
            # the library's convention: `loss` is the token mean over labels != -100 (no label smoothing here)
            totals[index] += model(**inputs).loss.double() * tokens
        totals[2] += tokens
    return totals


def source_use_metrics(totals: torch.Tensor, prefix: str = "eval") -> dict[str, float]:
    """`source_use_totals` as per-token figures: `<prefix>_nll` (nats per target token, no label smoothing),
    `<prefix>_nll_shuffled_source` and their difference `<prefix>_source_use`: how many nats per token the true source
    is worth. Near 0 means the decoder ignores its input (source neglect); a model that translates scores well
    above 1. Empty when there was nothing to score."""
    true_nll, shuffled_nll, tokens = totals.tolist()
    if tokens == 0:
        return {}
    true_nll, shuffled_nll = true_nll / tokens, shuffled_nll / tokens
    return {
        f"{prefix}_nll": true_nll,
        f"{prefix}_nll_shuffled_source": shuffled_nll,
        f"{prefix}_source_use": shuffled_nll - true_nll,
    }
