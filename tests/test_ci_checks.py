"""CI's check of the README's main job: a floor that follows the updates the job made, from the recorded runs, and
the pace that made them."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest


CHECK = Path(__file__).resolve().parents[1] / ".ci" / "check_main_job.py"
spec = importlib.util.spec_from_file_location("check_main_job", CHECK)
check_main_job = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_main_job)


def recorded_runs(path: Path) -> Path:
    """Two budgets of three seeds each (means: 850 updates at 28 BLEU in 5 minutes, 1750 at 34 in 10: 170 and 175
    updates a minute), run by two commits of the same recipe, and a bf16 run."""

    def run(commit, minutes, updates, bleu, bf16=False):
        record = {"commit": commit, "minutes": minutes, "updates": updates, "bf16": bf16, "test": {"test_bleu": bleu}}
        return {**record, "train_wall_s": minutes * 60}

    results = [run("new", 10, 1750, 99.0, bf16=True)]
    results += [run("old", 5, updates, bleu) for updates, bleu in ((840, 27.0), (850, 28.0), (860, 29.0))]
    results += [run("new", 10, updates, bleu) for updates, bleu in ((1700, 33.5), (1750, 34.0), (1800, 34.5))]
    path.write_text(json.dumps({"results": results}))
    return path


def test_the_curve_is_the_recipes_mean_per_budget_joined_by_lines(tmp_path):
    curve = check_main_job.recorded_curve(recorded_runs(tmp_path / "runs.json"))
    assert curve == [(850, 28.0), (1750, 34.0)]
    expected = [check_main_job.expected_bleu(curve, updates) for updates in (425, 850, 1300, 1750, 4000)]
    assert expected == pytest.approx([14.0, 28.0, 31.0, 34.0, 34.0])


def test_the_recorded_pace_is_the_slowest_budgets_mean_updates_a_minute(tmp_path):
    assert check_main_job.recorded_pace(recorded_runs(tmp_path / "runs.json")) == pytest.approx(170.0)


@pytest.mark.parametrize(
    ("updates", "minutes", "bleu", "passes"),
    [
        (1300, 7, 28.1, True),
        (1300, 7, 27.9, False),
        (600, 3.5, 17.0, True),
        (840, 10, 28.0, False),
        (850, 10, 28.0, True),
    ],
)
def test_the_check_fails_below_the_curve_minus_the_margin_or_half_the_recorded_pace(
    tmp_path, updates, minutes, bleu, passes
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    scores = {"global_step": updates, "test_bleu": bleu, "train_wall_seconds": minutes * 60}
    (run_dir / "test_scores.json").write_text(json.dumps(scores))
    (tmp_path / "out.de").write_text("Ein Mann fährt Fahrrad.\nZwei Hunde spielen im Schnee.\n")
    command = [sys.executable, str(CHECK), str(run_dir), str(tmp_path / "out.de"), "--inputs", "2"]
    command += ["--curve", str(recorded_runs(tmp_path / "runs.json")), "--margin", "3"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert (result.returncode == 0) is passes, result.stdout + result.stderr
    assert f"{updates} updates" in result.stdout and "floor" in result.stdout
    if updates == 840:  # 84 a minute, where 85 (half of 170) is the least that passes
        assert "84.0 updates a minute is below 0.5 of the recorded pace (170.0)" in result.stderr
