"""Hugging Face's own `examples/pytorch/translation/run_translation.py` (unmodified, from ../shared/thirdparty) as a
user runs it against an hf_vanilla folder: remote code only, offline, with our metric standing in for the Hub's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla.data import read_lines

from .conftest import MULTI30K, REMOTE_PIPELINE, run_without_hf_vanilla


RUN_TRANSLATION = Path(__file__).resolve().parents[2] / "shared" / "thirdparty" / "run_translation.py"
# What the README tells users to write: `evaluate.load("sacrebleu")` finds `sacrebleu/sacrebleu.py` in the working
# directory before it tries the Hub.
OFFLINE_SACREBLEU = "from hf_vanilla.training.metrics import TranslationMetric as Sacrebleu  # noqa: F401\n"


def write_json_lines(path: Path, split: str, count: int) -> None:
    sources, targets = read_lines(MULTI30K / f"{split}.en.gz")[:count], read_lines(MULTI30K / f"{split}.de.gz")[:count]
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
    VanillaTransformerForConditionalGeneration(config).save_pretrained(model_folder)
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

    evaluation = json.loads((output / "eval_results.json").read_text())
    assert 0.0 <= evaluation["eval_bleu"] <= 100.0  # computed by our metric under evaluate's sacrebleu name
    assert (output / "generated_predictions.txt").read_text().count("\n") >= 15
    for folder in (output, output / "checkpoint-4"):  # the final folder and a Trainer checkpoint
        config_json = json.loads((folder / "config.json").read_text())
        assert config_json["custom_pipelines"]["translation"]["impl"] == "pipeline_vanilla.VanillaTranslationPipeline"
        assert (folder / "pipeline_vanilla.py").exists()
    stdout = run_without_hf_vanilla(REMOTE_PIPELINE, [str(output), json.dumps(["A dog runs."])], tmp_path)
    assert isinstance(json.loads(stdout.strip().splitlines()[-1])[0], str)
