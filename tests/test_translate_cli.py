"""`translate_lines` and `hf-vanilla translate`: input order kept, batching changes nothing, the plot is drawn."""

import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from hf_vanilla.inference import translate_lines
from hf_vanilla.plotting import plot_cross_attention

from .conftest import make_model


LINES = ["Two children play.", "A woman in a red dress sings on a stage in front of many people.", "A dog.", "Hi"]


@pytest.fixture(scope="module")
def saved_model(small_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    # Peaked, source-dependent outputs from a random model (see test_generation's fixture).
    model = make_model(seed=7, vocab_size=len(small_tokenizer), init_std=1.0, qkv_init_gain=1.0)
    model.save_pretrained(folder)
    small_tokenizer.save_pretrained(folder)
    return folder, model, small_tokenizer


def test_batched_by_length_equals_one_by_one_in_input_order(saved_model):
    _, model, tokenizer = saved_model
    # a = 0, b = 9: a fixed budget, so the never-stopping random model's outputs compare across batch shapes.
    options = dict(length_ratio=0.0, length_offset=9, progress=False, num_beams=1)
    batched = translate_lines(model, tokenizer, LINES, batch_size=3, **options)
    alone = [translate_lines(model, tokenizer, [line], batch_size=1, **options)[0] for line in LINES]
    assert batched == alone and len(batched) == len(LINES)
    nbest = translate_lines(
        model, tokenizer, LINES, batch_size=2, num_return_sequences=2, **{**options, "num_beams": 3}
    )
    assert all(len(candidates) == 2 for candidates in nbest)


def test_length_budget_is_a_times_source_plus_b(saved_model):
    _, model, tokenizer = saved_model
    (translation,) = translate_lines(model, tokenizer, ["A dog."], length_ratio=2.0, length_offset=1, num_beams=1)
    source_length = len(tokenizer("A dog.")["input_ids"])
    produced = tokenizer(translation[0], add_special_tokens=False)["input_ids"]
    assert 0 < len(produced) <= 2 * source_length + 1 + 2  # re-tokenising decoded bytes may merge differently


def test_empty_line_is_an_error(saved_model):
    _, model, tokenizer = saved_model
    with pytest.raises(ValueError, match="line 2"):
        translate_lines(model, tokenizer, ["A dog.", "", "Hi"], progress=False)


def test_cli_reads_stdin_and_draws_attention(saved_model, tmp_path):
    folder, model, _ = saved_model
    plot = tmp_path / "attention.png"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_vanilla",
            "translate",
            str(folder),
            "--beam",
            "1",
            "--max-len-a",
            "0",
            "--max-len-b",
            "9",
            "--batch-size",
            "2",
            "--attention-plot",
            str(plot),
            "--no-progress",
        ],
        input="\n".join(LINES) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    expected = translate_lines(model, tokenizer, LINES, length_ratio=0.0, length_offset=9, progress=False, num_beams=1)
    assert result.stdout.split("\n")[:-1] == [candidates[0] for candidates in expected]  # not splitlines: \x1e etc.
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_attention_plot_returns_the_translation(saved_model, tmp_path):
    _, model, tokenizer = saved_model
    text = plot_cross_attention(model, tokenizer, LINES[0], tmp_path / "a.png", max_new_tokens=6, num_beams=1)
    assert text == translate_lines(model, tokenizer, LINES[:1], length_ratio=0, length_offset=6, num_beams=1)[0][0]
    assert model.config._attn_implementation == "eager"  # restored
