"""CTranslate2 export: float32 gives the tokens generate() gives; int8 mostly agrees."""

import pytest
import torch

from benchmarks.synthetic import word_level_tokenizer

from .conftest import EOS, make_model


ctranslate2 = pytest.importorskip("ctranslate2")
from hf_vanilla.interop.ctranslate2 import export_ctranslate2  # noqa: E402


VOCAB = 24


@pytest.fixture(scope="module")
def trained():
    """A tiny model trained to reverse sequences, so its outputs are confident and meaningful."""
    model = make_model(seed=0, vocab_size=VOCAB, dropout=0.0, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98), eps=1e-9)
    generator = torch.Generator().manual_seed(0)
    for _ in range(1200):
        lengths = torch.randint(2, 8, (32,), generator=generator)
        body = torch.randint(4, VOCAB, (32, 8), generator=generator)
        source = torch.full((32, 9), 0)
        target = torch.full((32, 9), -100)
        for row, length in enumerate(lengths.tolist()):
            source[row, :length] = body[row, :length]
            source[row, length] = EOS
            target[row, :length] = body[row, :length].flip(0)
            target[row, length] = EOS
        loss = model(input_ids=source, attention_mask=source.ne(0), labels=target).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), word_level_tokenizer(VOCAB)


_lengths = torch.randint(1, 8, (40,), generator=torch.Generator().manual_seed(1)).tolist()
SOURCES = [[5, 9, 13, 7], [20, 4], [6, 6, 11, 18, 22, 10]] + [
    torch.randint(4, VOCAB, (n,), generator=torch.Generator().manual_seed(i)).tolist() for i, n in enumerate(_lengths)
]


def hf_outputs(model, num_beams):
    rows = [ids + [EOS] for ids in SOURCES]
    width = max(map(len, rows))
    input_ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    out = model.generate(
        input_ids=input_ids, attention_mask=input_ids.ne(0), num_beams=num_beams, length_penalty=1.0, max_new_tokens=12
    )
    return [[t for t in row.tolist()[1:] if t not in (0, EOS)] for row in out]


def ct2_outputs(folder, tokenizer, num_beams, compute_type="default"):
    translator = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type)
    batch = [tokenizer.convert_ids_to_tokens(ids + [EOS]) for ids in SOURCES]
    results = translator.translate_batch(batch, beam_size=num_beams, length_penalty=1.0, max_decoding_length=12)
    return [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam4"])
def test_float32_export_is_token_identical(trained, tmp_path, num_beams):
    model, tokenizer = trained
    export_ctranslate2(model, tokenizer, tmp_path / "ct2")
    expected = hf_outputs(model, num_beams)
    assert expected[0] == [7, 13, 9, 5]  # the model really learned to reverse
    assert ct2_outputs(tmp_path / "ct2", tokenizer, num_beams) == expected


def test_int8_export_mostly_agrees_and_leaves_the_model_alone(trained, tmp_path):
    model, tokenizer = trained
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    export_ctranslate2(model, tokenizer, tmp_path / "ct2-int8", quantization="int8")
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    expected = hf_outputs(model, 4)
    got = ct2_outputs(tmp_path / "ct2-int8", tokenizer, 4, compute_type="int8")
    agreement = sum(a == b for a, b in zip(got, expected, strict=True)) / len(expected)
    assert agreement >= 0.95
