"""Translation metrics that need no download: sacreBLEU's BLEU and chrF as an `evaluate` metric, and the
`compute_metrics` hook that feeds it generated ids."""

import evaluate
import numpy as np
from transformers import PreTrainedTokenizerBase


class TranslationMetric(evaluate.Metric):
    """Corpus BLEU and chrF with sacreBLEU, as an `evaluate` metric that needs no download (the Hub's
    `evaluate.load("sacrebleu")` fetches a script at run time). Returns the scores and their signatures."""

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
        bleu = BLEU(tokenize=self.tokenize, lowercase=self.lowercase)
        chrf = CHRF(lowercase=self.lowercase)
        bleu_score, chrf_score = bleu.corpus_score(predictions, streams), chrf.corpus_score(predictions, streams)
        return {
            "bleu": bleu_score.score,
            "chrf": chrf_score.score,
            "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()),
        }


def build_compute_metrics(tokenizer: PreTrainedTokenizerBase, metric: TranslationMetric):
    """`compute_metrics` for `predict_with_generate`: -100 (padding between batches) becomes pad before decoding."""

    def compute_metrics(eval_prediction) -> dict:
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        predictions = np.where(predictions == -100, tokenizer.pad_token_id, predictions)
        labels = np.where(labels == -100, tokenizer.pad_token_id, labels)
        hypotheses = tokenizer.batch_decode(predictions, skip_special_tokens=True)
        references = [[text] for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        scores = metric.compute(predictions=hypotheses, references=references)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}  # Trainer logs numbers only

    return compute_metrics
