"""Joint BPE on Multi30k, and `pipeline("translation")` in its three forms on transformers 5."""

import copy
import gc
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from transformers import AutoTokenizer, pipeline

from hf_vanilla import VanillaTranslationPipeline
from hf_vanilla import pipeline_vanilla as pipeline_module
from hf_vanilla.text_files import stream_lines
from hf_vanilla.tokenization import WordCachedEncoder, train_bpe_tokenizer, unknown_token_rate
from hf_vanilla.training.preprocessing import PairEncoder, id_type

from .conftest import EOS, MULTI30K, REMOTE_PIPELINE, REVERSAL_SOURCES, make_model, run_without_hf_vanilla


@pytest.mark.slow
def test_multi30k_round_trip_and_unknown_rate(capsys):
    train = list(stream_lines(MULTI30K / "train.en.gz")) + list(stream_lines(MULTI30K / "train.de.gz"))
    tokenizer = train_bpe_tokenizer(train, vocab_size=8000, show_progress=False)
    assert len(tokenizer) == 8000
    for language in ("en", "de"):
        test = list(stream_lines(MULTI30K / f"test2016.{language}.gz"))
        exact = sum(tokenizer.decode(tokenizer(s)["input_ids"], skip_special_tokens=True) == s for s in test)
        rate = unknown_token_rate(tokenizer, test)
        with capsys.disabled():
            print(f"\ntest2016.{language}: round trip {exact}/{len(test)}, unknown-token rate {rate:.4%}")
        assert exact / len(test) >= 0.999
        assert rate == 0.0  # byte-level BPE has no unknowns


def test_special_tokens_and_text_target(small_tokenizer, tmp_path):
    small_tokenizer.save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    batch = tokenizer(["Ein Hund läuft."], text_target=["A dog runs."])
    assert batch["input_ids"][0][-1] == batch["labels"][0][-1] == tokenizer.eos_token_id
    assert tokenizer.decode(batch["labels"][0], skip_special_tokens=True) == "A dog runs."
    text = "Zwei  Männer\tstehen — am Strand!"  # double space, TAB, non-ASCII: all survive
    assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text


def encoded_pairs(tokenizer, texts: list[str]) -> tuple[list, list]:
    """The ids and labels a corpus of `texts` on both sides gets from `PairEncoder`, the path a corpus takes."""
    table = PairEncoder(tokenizer, None)(pa.table({"source": texts, "target": texts}))
    return table.column("input_ids").to_pylist(), table.column("labels").to_pylist()


def test_encoding_a_corpus_gives_the_tokenizers_own_ids(small_tokenizer):
    texts = list(stream_lines(MULTI30K / "val.en.gz")) + list(stream_lines(MULTI30K / "val.de.gz"))
    texts += ["", "Hallo <s> Welt </s>", "x<pad>y<unk>", "a  b   c\t d", "it's we'll I'd", "10,000 km²", "  "]
    texts += ["\u00a0", "naïve café 😀 ﷽ \U0001fae8"]
    own = small_tokenizer(texts)["input_ids"]
    assert encoded_pairs(small_tokenizer, texts) == (own, small_tokenizer(text_target=texts)["input_ids"])
    assert id_type(small_tokenizer) == np.uint16
    padded = copy.deepcopy(small_tokenizer)
    padded(texts[:2], padding="max_length", max_length=64, truncation=True)  # leaves both set on its Rust tokenizer
    assert encoded_pairs(padded, texts) == (own, own)


def test_ids_of_a_vocabulary_over_65536_entries_take_32_bits():
    from benchmarks.synthetic import word_level_tokenizer

    tokenizer = word_level_tokenizer(70_000)
    assert id_type(tokenizer) == np.uint32
    texts = ["t4 t69999 t5", "t7"]
    assert encoded_pairs(tokenizer, texts) == (tokenizer(texts)["input_ids"],) * 2
    table = PairEncoder(tokenizer, None)(pa.table({"source": texts, "target": texts}))
    assert table.schema.field("input_ids").type == pa.list_(pa.uint32())


TRICKY = ["", "Hallo <s> Welt </s>", "x<pad>y<unk>", "a  b   c\t d", "it's we'll I'd", "10,000 km²", "  ", "\u00a0"]
TRICKY += ["naïve café 😀 ﷽ \U0001fae8", " leading", "trailing ", "ẞ ٣٤ 𝔘𝔫𝔦", "\u200b\u2028x\r\ny"]
TRICKY += ["snake_case __init__ ½\x1c"]


def validation_text() -> list[str]:
    return list(stream_lines(MULTI30K / "val.en.gz")) + list(stream_lines(MULTI30K / "val.de.gz"))


def test_the_word_cache_gives_the_tokenizers_own_ids(small_tokenizer):
    encoder = WordCachedEncoder.for_tokenizer(small_tokenizer)
    assert encoder is not None, "our own BPE takes the word cache"
    assert (encoder.prefix, encoder.suffix) == ([], [small_tokenizer.eos_token_id])
    texts = validation_text() + TRICKY
    expected = small_tokenizer(texts)["input_ids"]
    assert encoder(texts) == expected
    assert encoder(texts) == expected, "again, every word from the cache"
    cached = len(encoder.word_ids) + len(encoder.new_words)
    assert 0 < cached < sum(map(len, expected)) // 2, "each distinct word is encoded once"
    bounded = WordCachedEncoder.for_tokenizer(small_tokenizer)
    bounded.max_cached_bytes = 20_000
    assert bounded(texts) == expected and bounded.cached_bytes <= 20_000


def test_a_full_word_cache_keeps_the_frequent_words_and_never_keeps_long_ones(small_tokenizer):
    encoder = WordCachedEncoder.for_tokenizer(small_tokenizer)
    encoder.max_cached_bytes = 30_000
    frequent = "A man and a dog walk in the park ."
    long_tail = [f"{frequent} Zebra{n}x{n * 7919} q{n}w" for n in range(400)]  # made-up words, each met once
    texts = [frequent, frequent, *long_tail, "x" * 100 + " " + "9" * 80]
    assert encoder(texts) == small_tokenizer(texts)["input_ids"]
    assert encoder.cached_bytes <= 30_000
    assert all(word in encoder.word_ids for word in encoder.split_words(frequent)), "the frequent words stayed"
    assert not any(len(word) > 64 for word in [*encoder.word_ids, *encoder.new_words]), "long words are not kept"


def test_the_word_caches_byte_count_bounds_the_memory_it_really_holds():
    """The bound `max_cached_bytes` is enforced on the encoder's own count (`entry_bytes`), so that count must not be
    below what the kernel has to keep for the cache: measured here by tracemalloc, which sees every Python object
    the words' entries allocate (dict slots, the word strings, the id tuples, and the int objects of ids above 256,
    which CPython does not share). Multi30k's words and a long tail of made-up compounds of two of them (about 5 ids
    a word, most above 256: a 4000-entry BPE), none evicted; the count is also no more than twice what is held, or
    the bound would waste memory."""
    lines = list(stream_lines(MULTI30K / "train.en.gz"))[:4000]
    tokenizer = train_bpe_tokenizer(lines, vocab_size=4000, show_progress=False)
    encoder = WordCachedEncoder.for_tokenizer(tokenizer)
    known = sorted({word.strip() for line in lines for word in line.split() if word.isalpha()})
    compounds = [f"{first}{second.lower()}" for first, second in zip(known, known[1:] + known[:1], strict=True)]
    texts = [" ".join(words[i : i + 20]) for words in (known, compounds) for i in range(0, len(words), 20)]
    encoder(texts[:50])  # the characters' checks and the tokenizer's own first allocations, outside the measure
    encoder.word_ids.clear()
    encoder.new_words.clear()
    encoder.cached_bytes = encoder.frequent_bytes = 0
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert encoder(texts) == tokenizer(texts)["input_ids"]
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    entries = [*encoder.word_ids.items(), *encoder.new_words.items()]
    assert len(entries) > 5000 and sum(i > 256 for _, ids in entries for i in ids or ()) > 10_000
    assert encoder.cached_bytes == sum(encoder.entry_bytes(word, ids) for word, ids in entries), "nothing evicted"
    assert held <= encoder.cached_bytes <= 2 * held, (held, encoder.cached_bytes, len(entries))


def test_the_word_cache_is_off_where_the_tokenizer_splits_words_otherwise(small_tokenizer, monkeypatch):
    """A tokenizers release whose pattern changes structure (simulated: our copy groups digits by three, as GPT-4's
    does) still splits every single character the same; the structure probes see the difference."""
    from hf_vanilla import tokenization

    grouped_digits = tokenization.BYTE_LEVEL_WORDS.replace(r" ?\d+", r" ?\d{1,3}")
    assert grouped_digits != tokenization.BYTE_LEVEL_WORDS
    monkeypatch.setattr(tokenization, "BYTE_LEVEL_WORDS", grouped_digits)
    assert WordCachedEncoder.for_tokenizer(small_tokenizer) is None


def test_a_batch_whose_first_sentences_differ_from_the_tokenizer_raises(small_tokenizer):
    encoder = WordCachedEncoder.for_tokenizer(small_tokenizer)
    encoder(["A dog runs.", "A dog runs."])  # "dog" met twice: a frequent word
    encoder.word_ids[" dog"] = (5, 6, 7)  # what a divergent split would have cached
    with pytest.raises(RuntimeError, match="other ids than the tokenizer for 'Two dogs and a dog.'"):
        encoder(["Two dogs and a dog.", "Three cats."])


def test_the_tokenized_cache_key_names_the_encoder_and_the_tokenizers_release(small_tokenizer, monkeypatch):
    import tokenizers

    from hf_vanilla.training.preprocessing import PairEncoder

    identity = PairEncoder(small_tokenizer, None).identity
    assert identity.startswith("WordCachedEncoder ") and identity.endswith(f"tokenizers {tokenizers.__version__}")
    monkeypatch.setattr(tokenizers, "__version__", "99.0.0")
    assert PairEncoder(small_tokenizer, None).identity != identity


def test_the_word_cache_adds_what_the_post_processor_adds_and_leaves_added_tokens_to_the_tokenizer(small_tokenizer):
    from tokenizers import processors

    tokenizer = copy.deepcopy(small_tokenizer)  # RoBERTa's template: <s> before the sentence, </s> after it
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    tokenizer.add_tokens(["<sep>", "Hund"])  # matched whole, before the pre-tokenizer splits
    encoder = WordCachedEncoder.for_tokenizer(tokenizer)
    assert (encoder.prefix, encoder.suffix) == ([1], [2])
    texts = ["Ein Hund<sep>läuft.", "Hunde laufen", "A dog runs."] + TRICKY
    assert encoder(texts) == tokenizer(texts)["input_ids"]


@pytest.mark.slow
def test_the_word_cache_gives_the_tokenizers_own_ids_across_unicode(small_tokenizer):
    # Each code point after a letter, a digit, a punctuation mark, a space and its like: where Python's `regex` and the
    # tokenizer's Oniguruma class a character differently (recent Unicode), the sentence goes through the tokenizer.
    code_points = [*range(0x20, 0x3000), *range(0x3000, 0x10000, 13), *range(0x10000, 0x110000, 97)]
    characters = [chr(c) for c in code_points if not 0xD800 <= c <= 0xDFFF]
    encoder = WordCachedEncoder.for_tokenizer(small_tokenizer)
    for separator in ("", "a", "1", "!", " "):
        body = "".join(separator + character for character in characters)
        texts = [body[i : i + 120] for i in range(0, len(body), 120)]
        assert encoder(texts) == small_tokenizer(texts)["input_ids"], repr(separator)
    assert not all(encoder.same_split.values()), "the check met characters the two engines class differently"


def tokenizers_the_word_cache_cannot_reproduce(tokenizer) -> dict:
    from tokenizers import normalizers, pre_tokenizers

    variants = {name: copy.deepcopy(tokenizer) for name in ("normalizer", "metaspace", "prefix space", "dropout")}
    variants["normalizer"].backend_tokenizer.normalizer = normalizers.NFKC()
    variants["metaspace"].backend_tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    variants["prefix space"].backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    variants["dropout"].backend_tokenizer.model.dropout = 0.5
    variants["padding"] = copy.deepcopy(tokenizer)
    variants["padding"].backend_tokenizer.enable_padding(length=40)
    return variants


def test_tokenizers_the_word_cache_cannot_reproduce_go_through_the_tokenizer(small_tokenizer):
    from benchmarks.synthetic import word_level_tokenizer

    variants = tokenizers_the_word_cache_cannot_reproduce(small_tokenizer)
    variants["word level"] = word_level_tokenizer(400)
    for name, tokenizer in variants.items():
        assert WordCachedEncoder.for_tokenizer(tokenizer) is None, name
        assert PairEncoder(tokenizer, None).word_cache is None, name  # so `encode_texts`: the tokenizer's own call


@pytest.fixture
def translator_parts(small_tokenizer):
    model = make_model(seed=7, vocab_size=len(small_tokenizer), init_std=1.0)
    return model, small_tokenizer


SOURCES = ["A man is walking his dog.", "Two children play.", "A woman in a red dress sings on a stage."]


# The random test model never emits EOS, so every comparison fixes the length budget explicitly.
BUDGET = dict(max_new_tokens=15)


def reference_translations(model, tokenizer, **generate_kwargs):
    """Each source translated alone with model.generate: the truth a batched pipeline must reproduce."""
    translations = []
    for text in SOURCES:
        out = model.generate(**tokenizer(text, return_tensors="pt"), **BUDGET, **generate_kwargs)
        translations.append(tokenizer.decode(out[0], skip_special_tokens=True))
    return translations


def test_form_a_model_object(translator_parts):
    model, tokenizer = translator_parts
    translator = pipeline("translation", model=model, tokenizer=tokenizer)
    assert isinstance(translator, VanillaTranslationPipeline)
    single = translator(SOURCES[0], num_beams=1, **BUDGET)
    assert isinstance(single, list) and set(single[0]) == {"translation_text"}
    outputs = translator(SOURCES, batch_size=2, num_beams=1, **BUDGET)
    assert [o["translation_text"] for o in outputs] == reference_translations(model, tokenizer, num_beams=1)
    assert single[0]["translation_text"] == outputs[0]["translation_text"]
    # Paper defaults from the generation config (beam 4, length penalty 0.6), batch == one by one.
    beams = translator(SOURCES, batch_size=3, **BUDGET)
    assert [o["translation_text"] for o in beams] == reference_translations(model, tokenizer)
    capped = translator(SOURCES[0], num_beams=1, max_new_tokens=3)
    short = model.generate(**tokenizer(SOURCES[0], return_tensors="pt"), num_beams=1, max_new_tokens=3)
    assert short.shape[1] == 1 + 3
    assert capped[0]["translation_text"] == tokenizer.decode(short[0], skip_special_tokens=True)


def teacher_forced_log_prob(model, source: torch.Tensor, candidate: torch.Tensor) -> tuple[float, int]:
    """Sum of the log-probabilities of a generated candidate (after the decoder start, up to its EOS) and its
    length: the terms of beam search's score `sum / length ** length_penalty`."""
    ends = (candidate[1:] == EOS).nonzero()  # candidate[0] is the decoder start
    length = ends[0, 0].item() + 1 if len(ends) else len(candidate) - 1  # up to the first EOS, or the budget
    tokens = candidate[1 : 1 + length]
    with torch.no_grad():
        logits = model(input_ids=source, decoder_input_ids=candidate[None, :length]).logits[0]
    return logits.log_softmax(-1).gather(-1, tokens[:, None]).sum().item(), length


def test_the_length_penalty_divides_by_length_and_reaches_the_pipelines_n_best(unsure_reversal_model):
    model, tokenizer = unsure_reversal_model
    translator = pipeline("translation", model=model, tokenizer=tokenizer)
    texts = [" ".join(f"t{i}" for i in ids) + " </s>" for ids in REVERSAL_SOURCES]
    nbest = {}
    for penalty in (-2.0, 0.0, 2.0):
        for text in texts:
            source = tokenizer(text, return_tensors="pt", return_token_type_ids=False)["input_ids"]
            out = model.generate(input_ids=source, num_beams=4, num_return_sequences=3, length_penalty=penalty,
                                 max_new_tokens=12, output_scores=True, return_dict_in_generate=True)  # fmt: skip
            for candidate, score in zip(out.sequences, out.sequences_scores.tolist(), strict=True):
                log_prob, length = teacher_forced_log_prob(model, source, candidate)  # independent of generate
                assert score == pytest.approx(log_prob / length**penalty, rel=1e-5, abs=1e-4)  # float32 sums
            nbest[penalty, text] = tokenizer.batch_decode(out.sequences, skip_special_tokens=True)
        piped = translator(texts, num_beams=4, num_return_sequences=3, length_penalty=penalty, max_new_tokens=12)
        assert [[c["translation_text"] for c in candidates] for candidates in piped] == [
            nbest[penalty, text] for text in texts
        ]
    # The penalty decides each n-best (so the pipeline's equality above is about the penalty): the model is unsure of
    # every token, so dividing the log-probability by length**2 favours long candidates, multiplying by it short ones.
    for text in texts:
        short, long = (sum(len(candidate.split()) for candidate in nbest[p, text]) for p in (-2.0, 2.0))
        assert short < long, (text, nbest[-2.0, text], nbest[2.0, text])


def test_pipeline_rejects_empty_input(translator_parts):
    model, tokenizer = translator_parts
    translator = pipeline("translation", model=model, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="empty string"):
        translator("   ")
    with pytest.raises(ValueError, match="non-empty list"):
        translator([])


def test_form_b_saved_folder(translator_parts, tmp_path):
    model, tokenizer = translator_parts
    VanillaTranslationPipeline(model=model, tokenizer=tokenizer).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_vanilla.VanillaTranslationPipeline"
    assert (tmp_path / "pipeline_vanilla.py").exists() and (tmp_path / "tokenizer.json").exists()
    translator = pipeline("translation", model=str(tmp_path), model_kwargs={"attn_implementation": "eager"})
    assert isinstance(translator, VanillaTranslationPipeline)
    outputs = translator(SOURCES, num_beams=1, **BUDGET)
    assert [o["translation_text"] for o in outputs] == reference_translations(model, tokenizer, num_beams=1)


def test_form_c_remote_code_in_a_fresh_process(translator_parts, tmp_path):
    model, tokenizer = translator_parts
    folder = tmp_path / "model"
    VanillaTranslationPipeline(model=model, tokenizer=tokenizer).save_pretrained(folder)
    stdout = run_without_hf_vanilla(REMOTE_PIPELINE, [str(folder), json.dumps(SOURCES)], tmp_path)
    remote = json.loads(stdout.strip().splitlines()[-1])
    assert remote == reference_translations(model, tokenizer, num_beams=1)


def test_a_plain_save_pretrained_folder_translates_without_hf_vanilla(translator_parts, tmp_path):
    # No pipeline object involved: model.save_pretrained (what every Trainer checkpoint calls) writes the pipeline.
    model, tokenizer = translator_parts
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_vanilla.VanillaTranslationPipeline"
    assert (folder / "pipeline_vanilla.py").read_text() == Path(pipeline_module.__file__).read_text()
    stdout = run_without_hf_vanilla(REMOTE_PIPELINE, [str(folder), json.dumps(SOURCES)], tmp_path)
    assert json.loads(stdout.strip().splitlines()[-1]) == reference_translations(model, tokenizer, num_beams=1)


def test_language_pair_task_names_in_process_and_without_hf_vanilla(small_tokenizer, tmp_path):
    languages = {"source_language": "en", "target_language": "de"}
    model = make_model(seed=7, vocab_size=len(small_tokenizer), init_std=1.0, **languages)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    small_tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    assert set(config["custom_pipelines"]) == {"translation", "translation_en_to_de"}

    translator = pipeline("translation_en_to_de", model=str(folder), model_kwargs={"attn_implementation": "eager"})
    assert isinstance(translator, VanillaTranslationPipeline)
    expected = reference_translations(model, small_tokenizer, num_beams=1)
    assert [o["translation_text"] for o in translator(SOURCES, num_beams=1, **BUDGET)] == expected
    with pytest.raises(ValueError, match="this model translates 'translation_en_to_de'"):
        VanillaTranslationPipeline(model=model, tokenizer=small_tokenizer, task="translation_de_to_en")
    # any language pair is a translation task (as in transformers 4); the pipeline checks it against the model's
    with pytest.raises(ValueError, match="'translation_fr_to_en', but this model translates 'translation_en_to_de'"):
        pipeline("translation_fr_to_en", model=model, tokenizer=small_tokenizer)

    args = [str(folder), json.dumps(SOURCES), "translation_en_to_de"]
    assert json.loads(run_without_hf_vanilla(REMOTE_PIPELINE, args, tmp_path).strip().splitlines()[-1]) == expected


def test_translations_are_not_cut_at_twenty_tokens(translator_parts):
    model, tokenizer = translator_parts
    translator = pipeline("translation", model=model, tokenizer=tokenizer)
    generated = translator.model.generate  # the pipeline sets max_length = 1 + source length + 50
    calls = []

    def spy(**kwargs):
        calls.append(kwargs.get("max_length"))
        return generated(**kwargs)

    translator.model.generate = spy
    try:
        translator(SOURCES[2], num_beams=1)
    finally:
        del translator.model.generate
    assert calls == [1 + len(tokenizer(SOURCES[2])["input_ids"]) + 50]  # the decoder start token, then the budget
