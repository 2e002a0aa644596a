"""A training run killed (SIGKILL, also while it saves) or stopped by SIGTERM resumes to the weights of the run that
was never interrupted, through the worker and through the command users run."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import EarlyStoppingCallback, TrainerCallback

from hf_vanilla.training.callbacks import StopOnSigtermCallback
from hf_vanilla.training.train_state import read_train_state

from .conftest import word_budget_trainer
from .test_training_e2e import ENV, ROOT, SMOKE_COMMAND, WORKER, run


def train_worker(output: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(WORKER), str(output), "--max-steps", "12", "--save-steps", "4", *extra]
    return subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def uninterrupted_run_once(tmp_path_factory) -> dict:
    output = tmp_path_factory.mktemp("uninterrupted")
    assert train_worker(output).returncode == 0
    return json.loads((output / "rank0.json").read_text())


@pytest.fixture
def uninterrupted_run(uninterrupted_run_once, own) -> dict:
    return own(uninterrupted_run_once)


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [5, 8, 11])  # after a save; at a save step, before it saves; before the last
def test_killed_run_resumes_to_the_same_weights(tmp_path, uninterrupted_run, kill_at):
    killed = train_worker(tmp_path, "--kill-at", str(kill_at))
    assert killed.returncode == -9, (kill_at, killed.stderr[-2000:])  # SIGKILL: no clean shutdown
    assert not (tmp_path / "rank0.json").exists()
    assert train_worker(tmp_path, "--resume").returncode == 0

    resumed = json.loads((tmp_path / "rank0.json").read_text())
    assert resumed["step"] == 12
    assert resumed["weights"] == uninterrupted_run["weights"], f"killed at step {kill_at}"


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [8, 12])  # save steps: the kill lands between the weights and the optimizer
def test_killed_while_saving_resumes_from_the_last_complete_checkpoint(tmp_path, uninterrupted_run, kill_at):
    killed = train_worker(tmp_path, "--kill-while-saving", str(kill_at))
    assert killed.returncode == -9, (kill_at, killed.stderr[-2000:])
    newest = max(int(folder.name.split("-")[1]) for folder in tmp_path.glob("checkpoint-*"))
    assert newest == kill_at - 4  # the half-written checkpoint is not where a resume would look
    assert train_worker(tmp_path, "--resume").returncode == 0

    resumed = json.loads((tmp_path / "rank0.json").read_text())
    assert resumed["step"] == 12
    assert resumed["weights"] == uninterrupted_run["weights"], f"killed while saving step {kill_at}"
    assert not (tmp_path / ".incomplete-checkpoints").exists()  # the leftover was cleared by the next save


@pytest.mark.slow
@pytest.mark.parametrize("term_at", [5, 10])  # not save steps: only the signal saves there
def test_sigterm_saves_the_current_step_and_resumes_to_the_same_weights(tmp_path, uninterrupted_run, term_at):
    stopped = train_worker(tmp_path, "--terminate-at", str(term_at))
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    report = json.loads((tmp_path / "rank0.json").read_text())
    assert report["stopped_by_sigterm_at"] == report["step"] == term_at
    state = json.loads((tmp_path / f"checkpoint-{term_at}" / "trainer_state.json").read_text())
    assert state["global_step"] == term_at  # nothing lost: the checkpoint holds the last finished update

    assert train_worker(tmp_path, "--resume").returncode == 0
    resumed = json.loads((tmp_path / "rank0.json").read_text())
    assert resumed["step"] == 12 and resumed["stopped_by_sigterm_at"] is None
    assert resumed["weights"] == uninterrupted_run["weights"], f"SIGTERM at step {term_at}"


def logged_loss_steps(log: Path) -> list[int]:
    """The update numbers of the training-loss rows in a run's log.csv (`step,epoch,name,value`)."""
    return [int(row.split(",")[0]) for row in log.read_text().splitlines()[1:] if ",loss," in row]


@pytest.mark.slow
@pytest.mark.parametrize("cpu_processes", [1, 2])  # 2: the command starts itself twice, and forwards the signal
def test_train_command_exits_143_on_sigterm_and_resumes_where_it_stopped(tmp_path, cpu_processes):
    output = tmp_path / "run"
    command = [*SMOKE_COMMAND, "--output_dir", str(output), "--data_cache_dir", str(tmp_path / "data_cache")]
    command += ["--logging_steps", "1", "--eval_strategy", "no", "--average_last", "0", "--max_steps", "30"]
    command += ["--cpu_processes", str(cpu_processes), "--max_train_minutes", "60"]
    job = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = output / "log.csv"
    deadline = time.monotonic() + 300
    while not (log.exists() and len(logged_loss_steps(log)) >= 3):
        assert job.poll() is None and time.monotonic() < deadline, "training ended before it could be signalled"
        time.sleep(0.2)
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=300)
    assert job.returncode == 143, stderr[-3000:]
    assert "--resume_from_checkpoint last" in stderr
    stopped_at = logged_loss_steps(log)[-1]
    assert 3 <= stopped_at < 30 and (output / f"checkpoint-{stopped_at}").is_dir()
    assert not (output / "final").exists()  # it stopped; no test evaluation of a half-trained model
    batching = read_train_state(output / f"checkpoint-{stopped_at}")["batching"]
    assert (batching["processes"], batching["max_tokens"]) == (cpu_processes, 1024 // cpu_processes)
    seconds_at_stop = read_train_state(output / f"checkpoint-{stopped_at}")["train_seconds"]

    run([*command, "--resume_from_checkpoint", "last"])
    assert logged_loss_steps(log) == list(range(1, 31)), "every update is logged exactly once across the two runs"
    scores = json.loads((output / "test_scores.json").read_text())
    assert scores["global_step"] == 30 and f"; {cpu_processes} process(es);" in scores["hardware"]
    assert read_train_state(output / "checkpoint-30")["train_seconds"] > seconds_at_stop, (
        "the clock went on from the stop"
    )


def rank_process(output: Path, rank: int) -> int:
    """The pid of the training process of `rank` among those writing to `output` (its environment names its rank)."""
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if str(output).encode() in cmdline and f"RANK={rank}".encode() in environ and b"train" in cmdline:
            return int(proc.name)
    raise AssertionError(f"no process of rank {rank} writes to {output}")


@pytest.mark.slow
def test_a_sigterm_that_reaches_one_process_stops_every_process_at_the_same_update(tmp_path):
    """The signal reaches the processes of a job at different moments (here: only rank 1). A process that stopped
    alone would leave the others waiting for it in their next collective, forever."""
    output = tmp_path / "run"
    command = [*SMOKE_COMMAND, "--output_dir", str(output), "--data_cache_dir", str(tmp_path / "data_cache")]
    command += ["--logging_steps", "1", "--eval_strategy", "no", "--average_last", "0", "--max_steps", "30"]
    command += ["--cpu_processes", "2", "--max_train_minutes", "60"]
    job = subprocess.Popen(
        command, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    log = output / "log.csv"
    deadline = time.monotonic() + 300
    try:
        while not (log.exists() and len(logged_loss_steps(log)) >= 3):
            assert job.poll() is None and time.monotonic() < deadline, "training ended before it could be signalled"
            time.sleep(0.2)
        os.kill(rank_process(output, 1), signal.SIGTERM)
        _, stderr = job.communicate(timeout=300)
    finally:  # the launcher and both processes, also where they hang
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 143, stderr[-3000:]
    stopped_at = logged_loss_steps(log)[-1]
    assert 3 <= stopped_at < 30 and (output / f"checkpoint-{stopped_at}").is_dir()


class SigtermAt(TrainerCallback):
    """Sends this process SIGTERM at the end of update `step`, as a scheduler preempting the job does."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def epoch_run(output: Path, *callbacks: TrainerCallback, resume: bool = False):
    """Three epochs of 11 updates with dropout, evaluated and saved at each epoch's end, the best by validation loss
    kept and early stopping on (patience 1), as the published recipe runs; the SIGTERM stop is the recipe's."""
    from datasets import Dataset

    rows = [[4 + 3 * i + j for j in range(2 + i % 4)] + [2] for i in range(8)]
    lengths = list(map(len, rows))
    validation = Dataset.from_dict(
        {"input_ids": rows, "labels": rows, "source_length": lengths, "target_length": lengths}
    )
    early_stopping = EarlyStoppingCallback(early_stopping_patience=1)
    trainer = word_budget_trainer(
        output, max_tokens=36, callbacks=[*callbacks, StopOnSigtermCallback(), early_stopping], dropout=0.1,
        trainer_options={"eval_dataset": validation}, num_train_epochs=3, learning_rate=1e-3,
        eval_strategy="epoch", save_strategy="epoch", metric_for_best_model="loss", load_best_model_at_end=True,
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=resume or None)
    return trainer


STOPPED_EPOCH_RUN = """
import json, sys
from pathlib import Path
from tests.test_training_kills import SigtermAt, epoch_run

print(json.dumps({"global_step": epoch_run(Path(sys.argv[1]), SigtermAt(16)).state.global_step}))
"""


def evaluations(log_history: list[dict]) -> list[tuple[int, float]]:
    return [(entry["step"], entry["eval_loss"]) for entry in log_history if "eval_loss" in entry]


def test_a_sigterm_in_mid_epoch_neither_evaluates_nor_counts_in_patience(tmp_path):
    """The library ends the epoch a stop breaks off as a whole one, evaluating part of an epoch: that evaluation
    counted in early stopping's patience and could become the best checkpoint, so a resumed run ended elsewhere than
    the uninterrupted one. Interrupted at update 16 (epoch 1 of 0-2) and resumed, the run evaluates where and what the
    uninterrupted run does."""
    whole = epoch_run(tmp_path / "whole")
    expected = evaluations(whole.state.log_history)
    assert [step for step, _ in expected] == [11, 22, 33]

    # The signal goes to a process of its own, as a scheduler sends it to a job: never to the pytest worker, which
    # SIGTERM would end (as a CI run's worker ended in this test, with no traceback, when it signalled itself).
    stopped = run([sys.executable, "-c", STOPPED_EPOCH_RUN, str(tmp_path / "part")])
    assert json.loads(stopped.stdout.splitlines()[-1]) == {"global_step": 16}
    saved = json.loads((tmp_path / "part" / "checkpoint-16" / "trainer_state.json").read_text())
    assert [step for step, _ in evaluations(saved["log_history"])] == [11], "no evaluation of a part of an epoch"
    patience = saved["stateful_callbacks"]["EarlyStoppingCallback"]["attributes"]["early_stopping_patience_counter"]
    assert patience == 0
    resumed = epoch_run(tmp_path / "part", resume=True)
    got = evaluations(resumed.state.log_history)
    assert [step for step, _ in got] == [11, 22, 33]
    for (_, loss), (_, expected_loss) in zip(got, expected, strict=True):
        assert loss == pytest.approx(expected_loss, abs=1e-6)
    assert Path(resumed.state.best_model_checkpoint).name == Path(whole.state.best_model_checkpoint).name


def test_the_trainer_makes_every_stop_callback_ask_every_process(tmp_path):
    """A stop callback that a user hands the trainer asks the trainer's collective, not its own process alone: one
    that decided alone would stop while the others trained on, waiting for it in their next collective."""
    stop = StopOnSigtermCallback()
    trainer = word_budget_trainer(tmp_path, max_tokens=36, callbacks=[stop], max_steps=1)
    trainer.train()
    assert stop.agree == trainer.any_process
