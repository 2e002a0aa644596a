"""A joint source+target BPE vocabulary, trained with `tokenizers` and used as a `PreTrainedTokenizerFast`.

Byte-level BPE: every string is representable (no unknown tokens) and decoding gives back the input exactly, so
nothing is normalised away. `</s>` is appended to every sequence, sources and targets alike (`text_target=`).
"""

import re
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast


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


def plain_backend(tokenizer: PreTrainedTokenizerBase) -> Tokenizer | None:
    """The Rust tokenizer behind `tokenizer` where `tokenizer(texts)` gives exactly its ids: a plain
    `PreTrainedTokenizerFast` (ours; it has no target mode) with neither padding nor truncation left set on it (a
    `__call__` with `padding="max_length"` leaves both, and its own calls reset them). None for other classes, which
    may switch vocabulary or language codes for targets."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if type(tokenizer) is PreTrainedTokenizerFast and backend.padding is None and backend.truncation is None:
        return backend
    return None


# The pattern that `pre_tokenizers.ByteLevel(use_regex=True)` splits words with (GPT-2's, in tokenizers' byte_level.rs:
# 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+), in the classes of Python's `re`:
# letters [^\W\d_], numbers \d, other [^\s\w] and _, space \s. Where a character's class differs between the two,
# `WordCachedEncoder.splits_the_same` finds it.
BYTE_LEVEL_WORDS = r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"""


class WordCachedEncoder:
    """The token ids of many sentences, each distinct word encoded by the tokenizer once and remembered, as fairseq's
    binarizer and fastBPE look words up: for tokenizing a whole corpus with a byte-level BPE (`train_bpe_tokenizer`'s,
    GPT-2's, RoBERTa's), whose merges never cross the pre-tokenizer's words.

    Why not the library alone: on one core, `encode_batch_fast` makes ~24k sentences/s, and the tokenizer's own
    pre-tokenizer (`pre_tokenize_str`) alone ~36k, so a word cache behind it gains little (~28k); splitting with
    Python's own regular expressions is what pays (`benchmarks/tokenize_speed.py`,
    docs/results/tokenize-speed-cpu.json). So the words come from `BYTE_LEVEL_WORDS` run by `re`, and everything else
    from the tokenizer's public pieces: a new word goes through `pre_tokenizer.pre_tokenize_str` (its byte-level form)
    and `model.tokenize` (its ids), and the special tokens the post-processor adds around a sentence are read off its
    output for an empty and a probe sentence.

    `re` classes a character as a letter, a number, a space or other by Python's Unicode tables, the tokenizer's
    Oniguruma by its own, and they differ on some characters (`_`, `²`, recent assignments), so each new character is
    first checked to split at the same places in both after a letter, a digit and a punctuation mark; a sentence with
    a character that does not, or with an added token's text (which the tokenizer matches whole, before splitting),
    goes through `encode_batch_fast` itself. `for_tokenizer` gives None for every tokenizer it cannot reproduce (a
    normalizer, another pre-tokenizer or model, BPE dropout, padding or truncation set). Ids identical to the
    tokenizer's: `tests/test_tokenizer_and_pipeline.py`, on real text, across Unicode and on tricky strings."""

    def __init__(self, backend: Tokenizer, prefix: list[int], suffix: list[int], max_cached_words: int = 500_000):
        self.backend, self.prefix, self.suffix, self.max_cached_words = backend, prefix, suffix, max_cached_words
        self.words = re.compile(BYTE_LEVEL_WORDS)
        self.split_words = self.words.findall
        added = sorted((token.content for token in backend.get_added_tokens_decoder().values()), key=len, reverse=True)
        self.added_text = re.compile("|".join(map(re.escape, added))).search if added else None
        self.word_ids: dict[str, tuple[int, ...] | None] = {}  # None: a word the two engines split differently
        self.same_split: dict[str, bool] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: PreTrainedTokenizerBase) -> "WordCachedEncoder | None":
        """An encoder giving `tokenizer(texts)["input_ids"]`, or None where `tokenizer` is not a byte-level BPE this
        class reproduces."""
        backend = plain_backend(tokenizer)
        if backend is None:
            return None
        pre_tokenizer, model = backend.pre_tokenizer, backend.model
        byte_level_words = (
            backend.normalizer is None
            and isinstance(pre_tokenizer, pre_tokenizers.ByteLevel)
            and pre_tokenizer.use_regex
            and not pre_tokenizer.add_prefix_space
            and isinstance(model, models.BPE)
            and not model.dropout
        )
        if not byte_level_words:
            return None
        around = backend.encode("").ids  # what the post-processor adds to every sentence, before or after it
        probe = "a probe, 1 2"
        body, whole = backend.encode(probe, add_special_tokens=False).ids, backend.encode(probe).ids
        for cut in range(len(around) + 1):
            if around[:cut] + body + around[cut:] == whole:
                return cls(backend, around[:cut], around[cut:])
        return None

    def __call__(self, texts: list[str]) -> list[list[int]]:
        """The ids of each of `texts`, special tokens added."""
        encoded = [self.encode(text) for text in texts]
        missing = [index for index, ids in enumerate(encoded) if ids is None]
        if missing:
            fallback = self.backend.encode_batch_fast([texts[index] for index in missing])
            for index, encoding in zip(missing, fallback, strict=True):
                encoded[index] = encoding.ids
        return encoded

    def encode(self, text: str) -> list[int] | None:
        """The ids of `text`, or None where the tokenizer must encode it itself."""
        if self.added_text is not None and self.added_text(text):
            return None
        words = self.split_words(text)
        try:  # the common case: every word known
            return [*self.prefix, *(i for word in words for i in self.word_ids[word]), *self.suffix]
        except (KeyError, TypeError):  # a new word, or one the engines split differently (None)
            pass
        ids = [*self.prefix]
        for word in words:
            if word not in self.word_ids:
                if len(self.word_ids) >= self.max_cached_words:  # memory stays bounded on any vocabulary
                    self.word_ids.clear()
                self.word_ids[word] = self.encode_word(word)
            word_ids = self.word_ids[word]
            if word_ids is None:
                return None
            ids.extend(word_ids)
        return ids + self.suffix

    def encode_word(self, word: str) -> tuple[int, ...] | None:
        """The ids of one word, or None when the tokenizer's pre-tokenizer would not split it, or its characters, as
        `BYTE_LEVEL_WORDS` does."""
        if not all(self.splits_the_same(character) for character in word):
            return None
        pieces = self.backend.pre_tokenizer.pre_tokenize_str(word)
        if len(pieces) != 1:
            return None
        return tuple(token.id for token in self.backend.model.tokenize(pieces[0][0]))

    def splits_the_same(self, character: str) -> bool:
        """Whether both patterns split `character` from a letter, a digit and a punctuation mark before it at the same
        places: each treats a character only by its class (letter, number, space, other)."""
        same = self.same_split.get(character)
        if same is None:
            probes = (f"a{character}", f"1{character}", f"!{character}")
            same = self.same_split[character] = all(
                [offsets for _, offsets in self.backend.pre_tokenizer.pre_tokenize_str(probe)]
                == [match.span() for match in self.words.finditer(probe)]
                for probe in probes
            )
        return same
