"""Elastic resume under torchrun: a run stopped on one number of processes resumes on another exactly where it
stopped in the batches' global order, whether updates shrink, stay or grow."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from hf_vanilla.training import TokenBudgetBatchSampler

from .conftest import torchrun
from .test_training_e2e import WORKER, run


def torchrun_worker(output: Path, processes: int, accumulation: int, *worker_args: str) -> list[dict]:
    """The worker under torchrun on the CPU (gloo); each rank's record, the batches it trained in order."""
    command = [*torchrun(processes), str(WORKER), str(output), "--epochs", "3", "--save-steps", "1000"]
    run([*command, "--gradient-accumulation", str(accumulation), *worker_args])
    return [json.loads((output / f"rank{rank}.json").read_text()) for rank in range(processes)]


def global_stream(ranks: list[dict]) -> list[list[tuple]]:
    """The batches the ranks trained in the global order: Accelerate deals it in turn, so rank i's k-th batch is the
    order's batch k x processes + i."""
    dealt = zip(*(rank["batches"] for rank in ranks), strict=True)  # every rank trains as many batches
    return [[tuple(ids) for ids in batch] for turn in dealt for batch in turn]


def pairs_of(batches: list[list[tuple]]) -> list[tuple]:
    return [pair for batch in batches for pair in batch]


@pytest.mark.slow
def test_a_run_resumes_on_another_number_of_processes_exactly_where_it_stopped(tmp_path):
    """Elastic resume under torchrun, stopped in the middle of epoch 2: 2 processes resumed on 1 and on 3, 1 on 2 with
    other gradient accumulation, and updates that grow: 1 process resumed on 2 and on 3, 2 on 4. Every update after
    the resume trains the next pairs of the uninterrupted run's global order: nothing trained twice, nothing skipped,
    every epoch ending at its last pair, all 3 epochs to the end."""
    whole = torchrun_worker(tmp_path / "whole", 2, 2)
    order = pairs_of(global_stream(whole))
    dataset = [tuple(ids) for ids in whole[0]["dataset"]]
    lengths = np.asarray([len(ids) for ids in dataset])  # the synthetic pairs' sides are equally long
    alone = TokenBudgetBatchSampler(lengths, max_tokens=48, seed=5)  # the worker's settings, one batch an update
    expected = []
    for epoch in range(3):
        alone.set_epoch(epoch)
        expected += [dataset[row] for batch in alone for row in batch]
    assert order == expected, "the uninterrupted run trains the global order"

    batches_per_epoch = len(alone)
    # (processes, accumulation) before -> after: updates of 4 batches shrink to 2 and 3, stay at 2, and grow from 1
    # to 2, 3 and 4 (where the rest of the epoch must be cut into whole updates of the larger size).
    cases = {(2, 2): [(1, 2), (3, 1)], (1, 2): [(2, 1)], (1, 1): [(2, 1), (3, 1)], (2, 1): [(4, 1)]}
    for before, after in cases.items():
        per_update = before[0] * before[1]
        stop = (batches_per_epoch + batches_per_epoch // 2) // per_update  # an update in the middle of epoch 2
        stopped = tmp_path / f"stopped-{before[0]}x{before[1]}"
        recorded = global_stream(torchrun_worker(stopped, *before, "--terminate-at", str(stop)))
        trained = pairs_of(recorded[: stop * per_update])  # the loader had fetched one batch more on every rank
        assert trained == order[: len(trained)] and len(dataset) < len(trained) < 2 * len(dataset)
        for processes, accumulation in after:
            resumed_dir = tmp_path / f"{before[0]}x{before[1]}-to-{processes}x{accumulation}"
            shutil.copytree(stopped, resumed_dir)
            resumed = torchrun_worker(resumed_dir, processes, accumulation, "--resume")
            stream = global_stream(resumed)
            updates = resumed[0]["step"] - stop
            assert len(stream) == updates * processes * accumulation, "every update takes its full share"
            assert trained + pairs_of(stream) == order, f"{before} resumed as {processes} x {accumulation}"
            assert resumed[0]["epoch"] == 3.0, "the run ends exactly at the end of its last epoch"
