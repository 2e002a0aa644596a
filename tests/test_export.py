"""CTranslate2 export: float32 gives the tokens generate() gives; int8 mostly agrees."""

import pytest
import torch

from .conftest import EOS, REVERSAL_SOURCES


ctranslate2 = pytest.importorskip("ctranslate2")
from hf_vanilla.interop.ctranslate2 import export_ctranslate2  # noqa: E402


def hf_outputs(model, num_beams):
    rows = [ids + [EOS] for ids in REVERSAL_SOURCES]
    width = max(map(len, rows))
    input_ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    out = model.generate(
        input_ids=input_ids, attention_mask=input_ids.ne(0), num_beams=num_beams, length_penalty=1.0, max_new_tokens=12
    )
    return [[t for t in row.tolist()[1:] if t not in (0, EOS)] for row in out]


def ct2_outputs(folder, tokenizer, num_beams, compute_type="default"):
    translator = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type)
    batch = [tokenizer.convert_ids_to_tokens(ids + [EOS]) for ids in REVERSAL_SOURCES]
    results = translator.translate_batch(batch, beam_size=num_beams, length_penalty=1.0, max_decoding_length=12)
    return [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam4"])
def test_float32_export_is_token_identical(reversal_model, tmp_path, num_beams):
    model, tokenizer = reversal_model
    export_ctranslate2(model, tokenizer, tmp_path / "ct2")
    expected = hf_outputs(model, num_beams)
    assert expected[0] == [7, 13, 9, 5]  # the model really learned to reverse
    assert ct2_outputs(tmp_path / "ct2", tokenizer, num_beams) == expected


def test_int8_export_mostly_agrees_and_leaves_the_model_alone(reversal_model, tmp_path):
    model, tokenizer = reversal_model
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    export_ctranslate2(model, tokenizer, tmp_path / "ct2-int8", quantization="int8")
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    expected = hf_outputs(model, 4)
    got = ct2_outputs(tmp_path / "ct2-int8", tokenizer, 4, compute_type="int8")
    agreement = sum(a == b for a, b in zip(got, expected, strict=True)) / len(expected)
    assert agreement >= 0.95
