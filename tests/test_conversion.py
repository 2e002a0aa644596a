"""MarianMT / OPUS-MT checkpoints convert with parity: same logits, same beam search."""

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel

from hf_vanilla.interop.marian import convert_marian, convert_marian_folder

from .conftest import padded_batch


def opus_mt_like(shared: bool, seed: int = 0) -> MarianMTModel:
    """A random MarianMT with OPUS-MT's choices: swish, scaled embeddings, static sinusoids, a logits bias, pad as
    decoder start, eos 0."""
    vocab, decoder_vocab = 90, (90 if shared else 70)
    config = MarianConfig(
        vocab_size=vocab,
        decoder_vocab_size=decoder_vocab,
        share_encoder_decoder_embeddings=shared,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        activation_function="swish",
        scale_embedding=True,
        max_position_embeddings=64,
        pad_token_id=decoder_vocab - 1,
        decoder_start_token_id=decoder_vocab - 1,
        eos_token_id=0,
        forced_eos_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # larger weights so beams and tokens really differ
            if "embed_positions" not in name:  # the fixed sinusoid table is a (frozen) parameter in Marian
                parameter.mul_(3.0)
        model.final_logits_bias.normal_(0, 0.1)
    return model


@pytest.fixture
def marian_batch():
    rows = [[5, 17, 33, 8, 0], [40, 12, 0], [18, 3, 27, 55, 61, 9, 0]]
    input_ids, attention_mask = padded_batch(rows, pad=69)
    return input_ids, attention_mask


@pytest.mark.parametrize("shared", [True, False], ids=["shared-vocab", "separate-vocab"])
def test_logits_and_beam_search_match_marian(shared, marian_batch):
    marian = opus_mt_like(shared, seed=2)  # a seed whose random model answers each source differently
    ours = convert_marian(marian)
    config = ours.config
    assert (config.sinusoid_layout, config.activation_function, config.add_final_logits_bias) == (
        "concatenated",
        "swish",
        True,
    )
    assert config.decoder_start_token_id == config.pad_token_id
    input_ids, attention_mask = marian_batch
    decoder_input_ids = torch.tensor([[config.pad_token_id, 4, 9, 22]] * 3)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    with torch.no_grad():
        difference = (marian(**inputs).logits - ours(**inputs).logits).abs().max().item()
    assert difference <= 1e-5

    generation = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=12, num_beams=4)
    expected = marian.generate(**generation)
    assert torch.equal(ours.generate(**generation), expected)
    assert len({tuple(row.tolist()) for row in expected}) > 1  # outputs depend on the source: not a trivial match


def test_ties_follow_the_marian_checkpoint():
    shared = convert_marian(opus_mt_like(shared=True))
    assert shared.model.encoder.embed_tokens.weight is shared.model.decoder.embed_tokens.weight
    assert shared.lm_head.weight is shared.model.encoder.embed_tokens.weight
    separate = convert_marian(opus_mt_like(shared=False))
    assert separate.model.encoder.embed_tokens.weight.shape[0] == 90
    assert separate.lm_head.weight is separate.model.decoder.embed_tokens.weight
    assert separate.lm_head.weight.shape[0] == 70


def test_folder_conversion_keeps_tokenizer_files(tmp_path, marian_batch):
    marian = opus_mt_like(shared=True, seed=4)
    marian.save_pretrained(tmp_path / "marian")
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        (tmp_path / "marian" / name).write_text(f"stand-in for {name}")
    convert_marian_folder(tmp_path / "marian", tmp_path / "vanilla")
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        assert (tmp_path / "vanilla" / name).read_text() == f"stand-in for {name}"
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "vanilla", attn_implementation="eager")
    input_ids, attention_mask = marian_batch
    generation = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=8, num_beams=4)
    assert torch.equal(reloaded.generate(**generation), marian.generate(**generation))


@pytest.fixture(scope="module")
def trained_marian_tokenizer(tmp_path_factory):
    """A real MarianTokenizer: SentencePiece models trained here on 2000 Multi30k lines per side."""
    spm = pytest.importorskip("sentencepiece")
    from transformers import MarianTokenizer

    from hf_vanilla.text_files import stream_lines

    from .conftest import MULTI30K

    folder = tmp_path_factory.mktemp("spm")
    pieces = set()
    for name, language in (("source", "en"), ("target", "de")):
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(list(stream_lines(MULTI30K / f"train.{language}.gz"))[:2000]),
            model_prefix=str(folder / name),
            vocab_size=200,
            model_type="unigram",
            bos_id=-1,
            eos_id=-1,
            unk_id=1,
            pad_id=-1,
            minloglevel=2,
        )
        (folder / f"{name}.model").rename(folder / f"{name}.spm")
        pieces |= {line.split("\t")[0] for line in (folder / f"{name}.vocab").read_text().splitlines()}
    ordered = ["</s>", "<unk>", *sorted(pieces - {"</s>", "<unk>"}), "<pad>"]  # Marian: eos 0, pad last
    (folder / "vocab.json").write_text(__import__("json").dumps({piece: i for i, piece in enumerate(ordered)}))
    return MarianTokenizer(
        vocab=str(folder / "vocab.json"), source_spm=str(folder / "source.spm"), target_spm=str(folder / "target.spm")
    )


@pytest.fixture
def marian_tokenizer(trained_marian_tokenizer, own):
    return own(trained_marian_tokenizer)


def test_a_tokenizer_with_a_target_mode_encodes_targets_through_its_own_call(marian_tokenizer):
    from hf_vanilla.training.preprocessing import PairEncoder

    texts = ["A dog runs.", "Zwei Männer stehen am Strand."]
    encoder = PairEncoder(marian_tokenizer, None)
    sources, targets = encoder.encode(texts, False).to_pylist(), encoder.encode(texts, True).to_pylist()
    assert sources == marian_tokenizer(texts)["input_ids"]
    assert targets == marian_tokenizer(text_target=texts)["input_ids"] and targets != sources  # its target model


def marian_for(tokenizer, seed: int) -> MarianMTModel:
    """A random OPUS-MT-like MarianMT sized and numbered for a real Marian `tokenizer`."""
    config = opus_mt_like(shared=True).config
    config.vocab_size = config.decoder_vocab_size = len(tokenizer)
    config.pad_token_id = config.decoder_start_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    return MarianMTModel(config).eval()


def test_converted_folder_translates_with_the_marian_tokenizer(marian_tokenizer, tmp_path):
    from transformers import pipeline

    tokenizer = marian_tokenizer
    marian = marian_for(tokenizer, seed=2)
    marian.save_pretrained(tmp_path / "marian")
    tokenizer.save_pretrained(tmp_path / "marian")
    convert_marian_folder(tmp_path / "marian", tmp_path / "vanilla")

    translator = pipeline(
        "translation", model=str(tmp_path / "vanilla"), model_kwargs={"attn_implementation": "eager"}
    )
    sources = ["A dog runs on the grass.", "Two men play football."]
    got = [t["translation_text"] for t in translator(sources, num_beams=4, max_new_tokens=10)]
    expected = [
        tokenizer.decode(
            marian.generate(**tokenizer(s, return_tensors="pt"), num_beams=4, max_new_tokens=10)[0],
            skip_special_tokens=True,
        )
        for s in sources
    ]
    assert got == expected


def test_the_translation_pipeline_serves_marian_as_its_own_generate(marian_tokenizer):
    # `import hf_vanilla` restores the task transformers 5 removed; other models must get exactly what their own
    # generation config gives, not our length budget or beam defaults.
    from transformers import pipeline

    tokenizer = marian_tokenizer
    marian = marian_for(tokenizer, seed=3)
    marian.generation_config.update(num_beams=3, max_length=12)  # what a MarianMT checkpoint sets (4, 512)
    translator = pipeline("translation", model=marian, tokenizer=tokenizer)
    sources = ["A dog runs on the grass.", "Two men play football in a park."]
    expected = [
        tokenizer.decode(marian.generate(**tokenizer(s, return_tensors="pt"))[0], skip_special_tokens=True)
        for s in sources
    ]
    assert [t["translation_text"] for t in translator(sources)] == expected
