"""Whole runs: the CI smoke recipe end to end, two processes under accelerate, and kill -> resume equality."""

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

from .conftest import needs_multi30k


ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "workers" / "train_worker.py"


def run(command: list[str], cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    return result


@needs_multi30k
@pytest.mark.slow
def test_smoke_recipe_tokenizer_train_evaluate_average_save_reload_translate(tmp_path):
    output = tmp_path / "run"
    result = run([sys.executable, "scripts/train.py", "--config", "configs/smoke.yaml", "--output_dir", str(output)])
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a" in result.stdout

    scores = json.loads((output / "test_scores.json").read_text())
    assert scores["global_step"] == 40 and scores["dropped_training_pairs"] == 0
    assert 0.0 <= scores["test_bleu"] <= 100.0 and "version:" in scores["bleu_signature"]
    assert (output / "tokenizer" / "tokenizer.json").exists()  # trained because none was given
    assert (output / "averaged" / "model.safetensors").exists() and (output / "averaged" / "tokenizer.json").exists()
    assert (output / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert list((output / "runs").rglob("events.out.tfevents.*")), "TensorBoard logs"
    log = (output / "log.csv").read_text().splitlines()
    assert log[0] == "step,epoch,name,value" and any(",eval_bleu," in row for row in log)
    losses = [float(row.split(",")[3]) for row in log[1:] if row.split(",")[2] == "loss"]
    assert losses[-1] < losses[0]  # it learns
    hyperparameters = json.loads((output / "final" / "hyperparameters.json").read_text())
    assert hyperparameters["checkpoints_averaged"] == 2 and hyperparameters["label_smoothing"] == 0.1

    model = AutoModelForSeq2SeqLM.from_pretrained(output / "final")
    tokenizer = AutoTokenizer.from_pretrained(output / "final")
    translation = pipeline("translation", model=model, tokenizer=tokenizer)("A dog runs.", num_beams=2)
    assert isinstance(translation[0]["translation_text"], str)


def launch_two_processes(output: Path, *worker_args: str) -> list[dict]:
    run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            "configs/accelerate_cpu.yaml",
            str(WORKER),
            str(output),
            *worker_args,
        ]
    )
    return [json.loads((output / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow
def test_two_cpu_processes_see_different_batches_and_end_identical(tmp_path):
    # 6 updates x 2 accumulated micro-batches per rank stay inside the first epoch, where batches never repeat.
    first, second = launch_two_processes(tmp_path, "--max-steps", "6")
    assert first["step"] == second["step"] == 6
    batches = [{tuple(map(tuple, batch)) for batch in rank["batches"]} for rank in (first, second)]
    assert len(batches[0]) >= 12 and len(batches[1]) >= 12
    assert not batches[0] & batches[1], "ranks must train on different data"
    assert first["weights"] == second["weights"], "DDP keeps the replicas identical"


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_weights(tmp_path):
    reference = tmp_path / "uninterrupted"
    run([sys.executable, str(WORKER), str(reference), "--max-steps", "12", "--save-steps", "4"])

    interrupted = tmp_path / "interrupted"
    kill_at = random.Random().randint(5, 11)  # any step after the first checkpoint
    killed = subprocess.run(
        [
            sys.executable,
            str(WORKER),
            str(interrupted),
            "--max-steps",
            "12",
            "--save-steps",
            "4",
            "--kill-at",
            str(kill_at),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, (kill_at, killed.stderr[-2000:])  # SIGKILL: no clean shutdown
    assert not (interrupted / "rank0.json").exists()
    run([sys.executable, str(WORKER), str(interrupted), "--max-steps", "12", "--save-steps", "4", "--resume"])

    resumed = json.loads((interrupted / "rank0.json").read_text())
    expected = json.loads((reference / "rank0.json").read_text())
    assert resumed["step"] == 12
    assert resumed["weights"] == expected["weights"], f"killed at step {kill_at}"
    shutil.rmtree(tmp_path)
