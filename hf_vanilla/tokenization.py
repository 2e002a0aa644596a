"""A joint source+target BPE vocabulary, trained with `tokenizers` and used as a `PreTrainedTokenizerFast`.

Byte-level BPE: every string is representable (no unknown tokens) and decoding gives back the input exactly, so
nothing is normalised away. `</s>` is appended to every sequence, sources and targets alike (`text_target=`).
"""

import copy
import re
from collections.abc import Iterable
from itertools import chain

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast


# Order = ids, matching the defaults of VanillaTransformerConfig (pad 0, bos 1, eos 2, unk 3).
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int = 10000, min_frequency: int = 2, show_progress: bool = True
) -> PreTrainedTokenizerFast:
    """Learn one BPE vocabulary of `vocab_size` entries (special tokens included) over source and target text."""
    special, minimum = list(SPECIAL_TOKENS.values()), len(SPECIAL_TOKENS) + 256  # and the 256 byte symbols
    if vocab_size <= minimum:
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
    return with_end_of_sequence(tokenizer)


def with_end_of_sequence(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """A trained `tokenizer` that appends `</s>` to every sequence, wrapped with the special tokens."""
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
    `PreTrainedTokenizerFast` (no target mode) without padding or truncation left set by a `__call__`, else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if type(tokenizer) is PreTrainedTokenizerFast and backend.padding is None and backend.truncation is None:
        return backend
    return None


def without_call_state(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """`tokenizer` (a copy where needed) without the padding and truncation a `__call__` leaves on its Rust backend:
    every call sets its own, so a cache key or an encoder picked by the tokenizer must not depend on them."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or (backend.padding is None and backend.truncation is None):
        return tokenizer
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.backend_tokenizer.no_padding()
    tokenizer.backend_tokenizer.no_truncation()
    return tokenizer


# The pattern that `pre_tokenizers.ByteLevel(use_regex=True)` splits words with (GPT-2's, in tokenizers' byte_level.rs:
# 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+), in the classes of Python's `re`:
# letters [^\W\d_], numbers \d, other [^\s\w] and _, space \s. Where a character's class differs between the two,
# `WordCachedEncoder.splits_the_same` finds it.
BYTE_LEVEL_WORDS = r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"""

# Texts whose words both patterns must split at the same places before the word cache is used: each is a way the
# tokenizer's pattern could change under us (tokenizers has no upper bound) while every single character still splits
# the same: contractions in both cases, digit runs (GPT-4-style groups of three), whitespace runs before a word and
# at the end, underscores, emoji with modifiers and joiners, mixed scripts.
STRUCTURE_PROBES = (
    "I'm sure it's theirs, they'll say we'd've. I'M SURE IT'S THEIRS, THEY'LL SAY WE'D'VE.",
    "1 12 123 1234 12345 123456789 2026-11-25 3.14159 1,000,000",
    "a  b   c\t\td\n\ne \u3000f   ",
    "__init__ self._cache snake_case_name",
    "😀😀👍🏽 👨‍👩‍👧 🇩🇪!",
    "naïve Ελλάδα Москва 東京 مرحبا नमस्ते Straße",
)
MAX_CACHED_WORD_CHARS = 64  # a longer "word" (a number, a URL, base64 text) is encoded each time, never kept
# What a cached word costs beside its characters and ids: its dict's entry and index slots (more just after the dict
# grows), the headers of its str and tuple objects. Each id adds a tuple slot, and an id above 256 an int object of
# its own as well (CPython shares only the small ints; a tokenizer returns a new int for each id); a character takes
# 1 to 4 bytes in a str, never more than in UTF-8. `tests/test_tokenizer_and_pipeline.py` holds the count to what
# tracemalloc sees held.
WORD_ENTRY_BYTES = 200
ID_SLOT_BYTES = 8
INT_OBJECT_BYTES = 32  # sys.getsizeof(257) is 28, and the allocator hands out 32
CHECKED_SENTENCES = 2  # of each batch, compared with the tokenizer's own ids


class WordCachedEncoder:
    """The token ids of many sentences, each distinct word encoded by the tokenizer once and remembered, as fairseq's
    binarizer and fastBPE look words up: for tokenizing a whole corpus with a byte-level BPE (`train_bpe_tokenizer`'s,
    GPT-2's, RoBERTa's), whose merges never cross the pre-tokenizer's words.

    Why not the library alone: the tokenizer's own pre-tokenizer (`pre_tokenize_str`) is itself most of
    `encode_batch_fast`'s time, so a word cache behind it gains little; splitting with Python's own regular expressions
    is what pays (`benchmarks/tokenize_speed.py`, docs/results/tokenize-speed-cpu.json). So the words come from
    `BYTE_LEVEL_WORDS` run by `re`, and everything else from the tokenizer's public pieces: a new word goes through
    `pre_tokenizer.pre_tokenize_str` (its byte-level form) and `model.tokenize` (its ids), and the special tokens the
    post-processor adds around a sentence are read off its output for an empty and a probe sentence.

    `re` classes a character as a letter, a number, a space or other by Python's Unicode tables, the tokenizer's
    Oniguruma by its own, and they differ on some characters (`_`, `²`, recent assignments), so each new character is
    first checked to split at the same places in both after a letter, a digit and a punctuation mark; a sentence with
    a character that does not, or with an added token's text (which the tokenizer matches whole, before splitting),
    goes through `encode_batch_fast` itself. `for_tokenizer` gives None for every tokenizer it cannot reproduce (a
    normalizer, another pre-tokenizer or model, BPE dropout, padding or truncation set). Ids identical to the
    tokenizer's: `tests/test_tokenizer_and_pipeline.py`, on real text, across Unicode and on tricky strings."""

    # 128 MiB a worker: a smaller bound lets a corpus with a long tail of word types evict words before their second
    # use (docs/training.md, "Scale", measures it).
    def __init__(self, backend: Tokenizer, prefix: list[int], suffix: list[int], max_cached_bytes: int = 128 << 20):
        self.backend, self.prefix, self.suffix, self.max_cached_bytes = backend, prefix, suffix, max_cached_bytes
        self.words = re.compile(BYTE_LEVEL_WORDS)
        self.split_words = self.words.findall
        added = sorted((token.content for token in backend.get_added_tokens_decoder().values()), key=len, reverse=True)
        self.added_text = re.compile("|".join(map(re.escape, added))).search if added else None
        # Two generations, so that a full cache keeps the frequent words: a new word waits in `new_words`, and moves
        # to `word_ids`, the one the common case reads, when it is met again. A full cache drops `new_words` (the long
        # tail seen once) and, only if the frequent words alone fill half of it, those too. None: a word the two
        # engines split differently.
        self.word_ids: dict[str, tuple[int, ...] | None] = {}
        self.new_words: dict[str, tuple[int, ...] | None] = {}
        self.cached_bytes = self.frequent_bytes = 0
        # Each character checked by `splits_the_same`, and the set of those that passed: a new word's characters are
        # looked up in that set at once, by C code (a Python call per character cost a third of a new word's time).
        self.same_split: dict[str, bool] = {}
        self.plain_characters: set[str] = set()

    @property
    def identity(self) -> str:
        """What decides this encoder's ids beside the tokenizer itself, for the key of a cache of them."""
        return f"WordCachedEncoder {BYTE_LEVEL_WORDS} tokenizers {tokenizers.__version__}"

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
                encoder = cls(backend, around[:cut], around[cut:])
                return encoder if all(map(encoder.splits_text_the_same, STRUCTURE_PROBES)) else None
        return None

    def __call__(self, texts: list[str]) -> list[list[int]]:
        """The ids of each of `texts`, special tokens added. The first `CHECKED_SENTENCES` are compared with the
        tokenizer's own, and a difference raises: a corpus cache never silently holds other ids.

        That check is a sample. Where the words are split wrongly for a share p of word occurrences, a call notices
        with probability 1 - (1 - p)**n, n the words of its checked sentences, and over a corpus n adds up over its
        calls (two a piece of 2000 pairs: sources and targets). WMT14 En-De (4.5M pairs, about 25 words a sentence)
        checks about 9000 sentences, n near 225,000: p = 1e-4 is caught for certain (1 - e**-22), p = 1e-5 with
        89%, p = 1e-6 with 20%. Multi30k (29k pairs, about 13 words) checks 60 sentences, n near 780: p = 1e-2 for
        certain, p = 1e-3 with 54%. What a sample cannot promise is a rule wrong for a few rare words. Such a rule
        comes from a character the two engines class differently, so each new character is checked on its own
        before a word holding it is cached (`splits_the_same`); the sample guards the rest."""
        encoded = [self.encode(text) for text in texts]
        missing = [index for index, ids in enumerate(encoded) if ids is None]
        if missing:
            fallback = self.backend.encode_batch_fast([texts[index] for index in missing])
            for index, encoding in zip(missing, fallback, strict=True):
                encoded[index] = encoding.ids
        checked = self.backend.encode_batch_fast(texts[:CHECKED_SENTENCES])
        for text, ours, theirs in zip(texts, encoded, checked, strict=False):
            if ours != theirs.ids:
                raise RuntimeError(
                    f"The word cache gives other ids than the tokenizer for {text!r} (tokenizers "
                    f"{tokenizers.__version__}): its split of words no longer matches the tokenizer's. Please report "
                    "it; meanwhile, use a tokenizer the word cache does not take (a normalizer set, say)."
                )
        return encoded

    def encode(self, text: str) -> list[int] | None:
        """The ids of `text`, or None where the tokenizer must encode it itself."""
        if self.added_text is not None and self.added_text(text):
            return None
        words = self.split_words(text)
        try:  # the common case: every word known
            return [*self.prefix, *chain.from_iterable(map(self.word_ids.__getitem__, words)), *self.suffix]
        except (KeyError, TypeError):  # a new word, or one the engines split differently (None)
            pass
        ids = [*self.prefix]
        for word in words:
            word_ids = self.word_ids[word] if word in self.word_ids else self.look_up(word)
            if word_ids is None:
                return None
            ids.extend(word_ids)
        return ids + self.suffix

    def look_up(self, word: str) -> tuple[int, ...] | None:
        """The ids of a word not among the frequent ones: from `new_words` (it becomes frequent), or encoded."""
        if word in self.new_words:
            word_ids = self.word_ids[word] = self.new_words.pop(word)
            self.frequent_bytes += self.entry_bytes(word, word_ids)
            return word_ids
        word_ids = self.encode_word(word)
        if len(word) <= MAX_CACHED_WORD_CHARS:
            self.new_words[word] = word_ids
            self.cached_bytes += self.entry_bytes(word, word_ids)
            if self.cached_bytes > self.max_cached_bytes:  # memory stays bounded on any corpus
                self.new_words.clear()
                if self.frequent_bytes > self.max_cached_bytes // 2:
                    self.word_ids.clear()
                    self.frequent_bytes = 0
                self.cached_bytes = self.frequent_bytes
        return word_ids

    @staticmethod
    def entry_bytes(word: str, word_ids: tuple[int, ...] | None) -> int:
        word_ids = word_ids or ()
        objects = sum(INT_OBJECT_BYTES for token_id in word_ids if token_id > 256)
        return WORD_ENTRY_BYTES + len(word.encode()) + ID_SLOT_BYTES * len(word_ids) + objects

    def encode_word(self, word: str) -> tuple[int, ...] | None:
        """The ids of one word, or None when the tokenizer's pre-tokenizer would not split it, or its characters, as
        `BYTE_LEVEL_WORDS` does."""
        if not self.plain_characters.issuperset(word) and not all(map(self.splits_the_same, word)):
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
            same = self.same_split[character] = all(map(self.splits_text_the_same, probes))
            if same:
                self.plain_characters.add(character)
        return same

    def splits_text_the_same(self, text: str) -> bool:
        """Whether `BYTE_LEVEL_WORDS` and the tokenizer's pre-tokenizer split `text` into the same words."""
        theirs = [offsets for _, offsets in self.backend.pre_tokenizer.pre_tokenize_str(text)]
        return theirs == [match.span() for match in self.words.finditer(text)]
