"""A joint source+target BPE vocabulary, trained with `tokenizers` and used as a `PreTrainedTokenizerFast`.

Byte-level BPE: every string is representable (no unknown tokens) and decoding gives back the input exactly, so
nothing is normalised away. `</s>` is appended to every sequence, sources and targets alike (`text_target=`).
"""

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast


# Order = ids, matching the defaults of VanillaTransformerConfig (pad 0, bos 1, eos 2, unk 3).
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int = 10000, min_frequency: int = 2, show_progress: bool = True
) -> PreTrainedTokenizerFast:
    """Learn one BPE vocabulary of `vocab_size` entries (special tokens included) over source and target text."""
    special = list(SPECIAL_TOKENS.values())
    if vocab_size <= len(special) + 256:
        minimum = len(special) + 256  # special tokens + the 256 byte symbols
        raise ValueError(f"`vocab_size` must exceed {minimum}, got {vocab_size}.")
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    eos = SPECIAL_TOKENS["eos_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, tokenizer.token_to_id(eos))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=1_000_000, **SPECIAL_TOKENS)


def unknown_token_rate(tokenizer: PreTrainedTokenizerFast, texts: Iterable[str]) -> float:
    """Share of produced tokens (EOS excluded) that are `<unk>`."""
    total = unknown = 0
    for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:
        total += len(ids)
        unknown += ids.count(tokenizer.unk_token_id)
    return unknown / max(total, 1)
