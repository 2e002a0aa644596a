"""Hugging Face's own `examples/pytorch/translation/run_translation.py` (unmodified, from ../shared/thirdparty) as a
user runs it against an hf_vanilla folder: remote code only, offline, with our metric standing in for the Hub's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import torch
from transformers import AutoTokenizer, pipeline

from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla.text_files import stream_lines

from .conftest import EOS, MULTI30K, PAD, REMOTE_PIPELINE, padded_batch, run_without_hf_vanilla


RUN_TRANSLATION = Path(__file__).resolve().parents[2] / "shared" / "thirdparty" / "run_translation.py"
# What docs/finetuning.md tells users to write: `evaluate.load("sacrebleu")` finds `sacrebleu/sacrebleu.py` in the
# working directory before it tries the Hub.
OFFLINE_SACREBLEU = "from hf_vanilla.training.metrics import TranslationMetric as Sacrebleu  # noqa: F401\n"


def write_json_lines(path: Path, split: str, count: int) -> None:
    sources = list(stream_lines(MULTI30K / f"{split}.en.gz"))[:count]
    targets = list(stream_lines(MULTI30K / f"{split}.de.gz"))[:count]
    rows = [{"translation": {"en": en, "de": de}} for en, de in zip(sources, targets, strict=True)]
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


@pytest.mark.slow
@pytest.mark.skipif(not RUN_TRANSLATION.exists(), reason="upstream run_translation.py is not beside the checkout")
def test_run_translation_trains_evaluates_and_writes_a_folder_that_translates_without_hf_vanilla(
    small_tokenizer, tmp_path
):
    model_folder = tmp_path / "model"
    config = VanillaTransformerConfig(
        vocab_size=len(small_tokenizer),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
    )
    with torch.random.fork_rng():  # the same weights whatever this worker ran before
        torch.manual_seed(0)
        model = VanillaTransformerForConditionalGeneration(config)
    # run_translation.py writes one prediction a line and the test reads them back with universal newlines: a
    # byte-level token that decodes to a line break would split a prediction in two, so the model may not emit one.
    breaks = [i for i in range(len(small_tokenizer)) if {"\n", "\r"} & set(small_tokenizer.decode([i]))]
    model.generation_config.suppress_tokens = breaks
    model.save_pretrained(model_folder)
    small_tokenizer.save_pretrained(model_folder)
    for split, count in (("train", 64), ("val", 16), ("test2016", 16)):
        write_json_lines(tmp_path / f"{split}.json", split, count)
    (tmp_path / "sacrebleu").mkdir()
    (tmp_path / "sacrebleu" / "sacrebleu.py").write_text(OFFLINE_SACREBLEU)

    output = tmp_path / "output"
    command = [
        sys.executable, str(RUN_TRANSLATION),
        "--model_name_or_path", str(model_folder), "--trust_remote_code",
        "--source_lang", "en", "--target_lang", "de",
        "--train_file", "train.json", "--validation_file", "val.json", "--test_file", "test2016.json",
        "--do_train", "--do_eval", "--do_predict", "--predict_with_generate",
        "--max_steps", "4", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
        "--num_beams", "2", "--label_smoothing_factor", "0.1",
        "--output_dir", str(output), "--report_to", "none", "--use_cpu", "--save_strategy", "steps",
        "--save_steps", "2",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PYTHONPATH": ""}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]

    # Its BLEU, computed by our metric under evaluate's sacrebleu name, is sacreBLEU's on what it wrote and on the
    # references as it decodes them (its compute_metrics scores tokenizer-decoded labels, rounded to 4 places).
    predictions = (output / "generated_predictions.txt").read_text(encoding="utf-8").split("\n")
    targets = [json.loads(line)["translation"]["de"] for line in (tmp_path / "test2016.json").read_text().splitlines()]
    labels = small_tokenizer(text_target=targets)["input_ids"]
    references = [label.strip() for label in small_tokenizer.batch_decode(labels, skip_special_tokens=True)]
    assert len(predictions) == 16
    bleu = json.loads((output / "predict_results.json").read_text())["predict_bleu"]
    assert bleu == pytest.approx(sacrebleu.corpus_bleu(predictions, [references]).score, abs=1e-4)
    for folder in (output, output / "checkpoint-4"):  # the final folder and a Trainer checkpoint
        config_json = json.loads((folder / "config.json").read_text())
        assert config_json["custom_pipelines"]["translation"]["impl"] == "pipeline_vanilla.VanillaTranslationPipeline"
        assert (folder / "pipeline_vanilla.py").exists()
    # Without hf_vanilla, through the folder's remote code, it translates as the package does.
    sources = ["A dog runs.", "Two men sit on a bench."]
    stdout = run_without_hf_vanilla(REMOTE_PIPELINE, [str(output), json.dumps(sources)], tmp_path)
    model = VanillaTransformerForConditionalGeneration.from_pretrained(output, attn_implementation="eager")
    translator = pipeline("translation", model=model, tokenizer=AutoTokenizer.from_pretrained(output))
    expected = translator(sources, num_beams=1, max_new_tokens=15, batch_size=2)
    assert json.loads(stdout.strip().splitlines()[-1]) == [o["translation_text"] for o in expected]


def test_beam_search_fills_finished_rows_with_eos_because_our_pad_id_is_0(reversal_model):
    """docs/finetuning.md's quirk, pinned: transformers' beam search fills finished rows with `pad_token_id or eos`
    (generation/utils.py), and a pad id of 0 is falsy, so our beam outputs continue with EOS where greedy ones continue
    with PAD. Decoded text (skip_special_tokens, as every path of ours decodes) is the same; run_translation.py's
    `gen_len` (non-pad tokens) counts the fill."""
    model, tokenizer = reversal_model
    input_ids, attention_mask = padded_batch([[5, 9, 13, 7, 11, EOS], [20, 4, EOS]])
    outputs = {
        beams: model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=beams, max_new_tokens=10)
        for beams in (1, 4)
    }
    assert model.config.pad_token_id == model.generation_config.pad_token_id == PAD == 0
    assert outputs[1][1, -1] == PAD and outputs[4][1, -1] == EOS  # the short row, after its end
    texts = {beams: tokenizer.batch_decode(ids, skip_special_tokens=True) for beams, ids in outputs.items()}
    assert texts[1] == texts[4] == ["t11 t7 t13 t9 t5", "t4 t20"]
    gen_len = {beams: [np.count_nonzero(row != PAD) for row in ids.numpy()] for beams, ids in outputs.items()}
    assert gen_len[4][1] > gen_len[1][1]
