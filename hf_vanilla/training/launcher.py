"""`hf-vanilla train` as several data-parallel processes on a machine without an accelerator (`cpu_processes`).

On a CPU, a small model's matrices are too small for one process to keep several cores busy: two processes of one
thread each, every one computing half of each update, make more updates a minute than one process of two threads
(`docs/results/cpu-processes-cpu.json`). The command then starts itself that many times through torchrun's own entry
point (`torch.distributed.run`), on this host, as a user's `torchrun --standalone --nproc_per_node N` would, and
gives each process `--max_tokens / N` tokens a batch: an update holds the tokens `--max_tokens` says, however many
processes share it.
"""

import logging
import os

import torch

from .arguments import launched_processes


# Set for the processes `launch` starts: how many it started, which their checkpoints record (`cpu_processes` sets
# each one's --max_tokens, so a resume with another count is refused naming it, not the option the launcher wrote).
CPU_PROCESSES_VARIABLE = "HF_VANILLA_CPU_PROCESSES"


logger = logging.getLogger(__name__)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, which a scheduler's cgroup may narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def processes_to_launch(cpu_processes: int) -> int:
    """How many processes `hf-vanilla train` should start itself: `cpu_processes`, at most one per usable core; 1
    under a launcher (torchrun, accelerate launch, srun: it decided) or where an accelerator trains instead."""
    if cpu_processes < 1:
        raise ValueError(f"--cpu_processes must be at least 1, got {cpu_processes}.")
    if launched_processes() > 1 or "LOCAL_RANK" in os.environ or torch.accelerator.is_available():
        return 1
    return min(cpu_processes, usable_cores())


def launch(processes: int, options: list[str], max_tokens: int) -> int:
    """Run `hf-vanilla train options` as `processes` data-parallel processes here; returns the exit status: 0, the
    first failed process's (128 + the signal for one killed by a signal), or 128 + the signal that stopped the
    launch (each process got it first: on SIGTERM they save a checkpoint and stop, as one process does)."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    per_process = max_tokens // processes
    threads = max(1, usable_cores() // processes)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # torchrun would set 1 and say so
    os.environ[CPU_PROCESSES_VARIABLE] = str(processes)
    logger.warning(
        "cpu_processes: training as %d processes of %s thread(s), each with batches of up to %d tokens (%d an update)",
        processes,
        os.environ["OMP_NUM_THREADS"],
        per_process,
        per_process * processes,
    )
    arguments = ["--standalone", "--nproc_per_node", str(processes), "--module", "hf_vanilla", "train", *options]
    try:
        run(parse_args([*arguments, "--max_tokens", str(per_process)]))
    except ChildFailedError as failed:
        _, failure = failed.get_first_failure()
        return 128 - failure.exitcode if failure.exitcode < 0 else failure.exitcode
    except SignalException as stopped:
        return 128 + stopped.sigval
    return 0
