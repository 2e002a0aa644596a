"""Past one host, as clusters launch: two nodes of one process each simulated on this host (torchrun, gloo,
127.0.0.1) through the real command, with node-local and shared data caches; and a resume on another number of
processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import EOS, free_port, torchrun


ROOT = Path(__file__).resolve().parents[1]
# A short run of the CI recipe: the whole first epoch (no step limit), no evaluation or checkpoint on the way.
SHORT = ["--config", "configs/smoke.yaml", "--max_steps", "-1", "--num_train_epochs", "1", "--eval_strategy", "no"]
SHORT += ["--save_strategy", "no", "--average_last", "0", "--max_test_examples", "8", "--report_to", "none"]
SHORT += ["--disable_tqdm", "true", "--dataloader_num_workers", "0"]
TIMEOUT = 600


def run_nodes(commands: list[list[str]], envs: list[dict]) -> list[str]:
    """Start every command at once (the nodes of one job), wait for all with a timeout, return their logs."""
    processes = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for command, env in zip(commands, envs, strict=True)
    ]
    try:
        logs = [process.communicate(timeout=TIMEOUT)[0] for process in processes]
    finally:
        for process in processes:
            process.kill()
    for process, log in zip(processes, logs, strict=True):
        assert process.returncode == 0, log[-4000:]
    return logs


def node_environment(cache: Path) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_DATASETS_CACHE": str(cache / "datasets"),
        "OMP_NUM_THREADS": "1",
    }


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["node-local caches", "shared caches"])
def test_two_nodes_of_one_process_train_as_one_job(tmp_path, layout):
    port, output = free_port(), tmp_path / "run"
    caches = [tmp_path / "shared"] * 2 if layout == "shared caches" else [tmp_path / "node0", tmp_path / "node1"]
    commands = [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--node_rank",
            str(node),
            "--nproc_per_node",
            "1",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            "-m",
            "hf_vanilla",
            "train",
            *SHORT,
            "--output_dir",
            str(output),
            "--data_cache_dir",
            str(caches[node] / "hf_vanilla"),
        ]
        for node in range(2)
    ]  # fmt: skip  (no --use_cpu: on CPU-only hosts the command goes distributed by itself)
    logs = run_nodes(commands, [node_environment(cache) for cache in caches])
    log = "\n".join(logs)

    # One job of two processes: each trains half of the epoch's batches, so the epoch takes half the updates.
    batches = int(log.split("[rank 0] startup: batches (")[1].split(" of at most")[0])
    scores = json.loads((output / "test_scores.json").read_text())
    assert batches % 2 == 0 and scores["global_step"] == batches // 2
    assert "2 process(es)" in scores["hardware"] and "[rank 1] startup" in log
    # Only the global main process writes the run: one log line per update, one tokenizer, one final model.
    steps = [row.split(",")[0] for row in (output / "log.csv").read_text().splitlines()[1:] if ",loss," in row]
    assert len(steps) == len(set(steps)) > 0
    assert (output / "final" / "model.safetensors").is_file() and (output / "tokenizer" / "tokenizer.json").is_file()

    built = [line for line in log.splitlines() if "startup: tokenizing (built" in line]
    if layout == "shared caches":
        assert "shared by all nodes, prepared once" in log
        assert len(built) == 1 and "[rank 1] startup: tokenizing (opened" in log
    else:
        assert "on each node's own disk, prepared once per node" in log
        assert len(built) == 2  # each node's main process, into its own disk
        tokenizers = [next((cache / "hf_vanilla" / "tokenizers").glob("*/tokenizer.json")) for cache in caches]
        assert tokenizers[0].read_bytes() == tokenizers[1].read_bytes()  # both nodes train with the same ids


def launch(processes: int, output: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    options = [*SHORT, "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2", *extra]
    options += ["--output_dir", str(output), "--data_cache_dir", str(cache)]
    if processes == 1:
        command = [sys.executable, "-m", "hf_vanilla", "train", *options]
    else:
        command = [*torchrun(processes), "-m", "hf_vanilla", "train", *options]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_DATASETS_CACHE": str(cache)}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)])
def test_the_command_resumes_on_another_number_of_processes_and_says_how_updates_changed(tmp_path, before, after):
    """The real command under torchrun; which pairs the resume trains is `tests/test_elastic_resume.py`'s test.
    `--max_steps 4` counts updates of the first run's size: resumed after 2 of them, the run trains the batches of 2
    more, in updates of the new size, and ends there (`tests/test_schedule_resume.py` checks every learning rate)."""
    output, cache = tmp_path / "run", tmp_path / "cache"
    first = launch(before, output, cache, "--max_steps", "2")
    assert first.returncode == 0, first.stderr[-4000:]
    resumed = launch(after, output, cache, "--resume_from_checkpoint", "last")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"An update now takes {after} batches ({after} process(es) x 1 accumulation step(s)" in resumed.stderr
    assert f"where the checkpoint's took {before}" in resumed.stderr
    end = 2 + 2 * before // after
    said = f"max_steps=4 counts updates of {before} batches: this run of {after}-batch updates ends at update {end}."
    assert said in resumed.stderr
    assert json.loads((output / f"checkpoint-{end}" / "trainer_state.json").read_text())["global_step"] == end


WORKER = ROOT / "tests" / "workers" / "fsdp_worker.py"


def nested_close(got, expected, tolerance: float) -> bool:
    return torch.allclose(torch.tensor(got), torch.tensor(expected), atol=tolerance)


@pytest.mark.slow
def test_fsdp2_shards_our_model_on_the_cpu_as_one_process_computes_it(tmp_path, reversal_model):
    """`fully_shard` over 2 gloo processes, where Accelerate turns FSDP off without CUDA: the tied embeddings and the
    chunked loss give one process's loss and gradients; FULL_STATE_DICT checkpoints load and average; `generate`
    with `synced_gpus` finishes when the ranks need different numbers of steps (upstream reports hangs); our trainer's
    `predict` with generation and beam search gives the unsharded model's translations, also where the ranks' sources
    end at different steps."""
    from hf_vanilla.loading import load_model
    from hf_vanilla.training.averaging import average_checkpoints

    reversal, _ = reversal_model
    reversal.save_pretrained(tmp_path / "reversal")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # the worker imports benchmarks/
    (tmp_path / "single").mkdir()
    (tmp_path / "sharded").mkdir()
    single = subprocess.run(
        [sys.executable, str(WORKER), str(tmp_path / "single"), "single", str(tmp_path / "reversal")],
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-4000:]
    sharded = subprocess.run(
        [*torchrun(2), str(WORKER), str(tmp_path / "sharded"), "sharded", str(tmp_path / "reversal")],
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert sharded.returncode == 0, sharded.stderr[-4000:]

    expected = json.loads((tmp_path / "single" / "single.json").read_text())
    got = json.loads((tmp_path / "sharded" / "fsdp.json").read_text())
    assert abs(got["loss"] - expected["loss"]) < 1e-6
    assert got["gradients"].keys() == expected["gradients"].keys()
    for name, gradient in expected["gradients"].items():
        assert nested_close(got["gradients"][name], gradient, 1e-5), name
    assert got["generated"] == expected["generated"]
    assert got["predictions"] == expected["predictions"]
    # and they are the reversals, each ended by EOS after 1 (rank 0's) or 7 (rank 1's) ids: the ranks stopped apart
    sources = [[5], [6, 7, 8, 9, 10, 11, 12], [9], [13, 14, 15, 16, 17, 18, 19]]
    for source, prediction in zip(sources, got["predictions"], strict=True):
        assert prediction[1 : len(source) + 2] == [*reversed(source), EOS], prediction
    for step in ("step-1", "step-2"):
        ours, reference = load_model(tmp_path / "sharded" / step), load_model(tmp_path / "single" / step)
        for (name, weight), other in zip(ours.state_dict().items(), reference.state_dict().values(), strict=True):
            assert torch.allclose(weight, other, atol=1e-5), (step, name)
    averaged = average_checkpoints([tmp_path / "sharded" / "step-1", tmp_path / "sharded" / "step-2"])
    first, second = (load_model(tmp_path / "sharded" / step).state_dict() for step in ("step-1", "step-2"))
    for name, weight in averaged.state_dict().items():
        assert torch.allclose(weight, (first[name] + second[name]) / 2, atol=1e-6), name


DCP_WORKER = ROOT / "tests" / "workers" / "dcp_worker.py"


def assert_states_close(got: dict, expected: dict, tolerance: float, skip: str = "\0") -> None:
    """Nested state dicts (model, optimizer) with the same keys, their tensors within `tolerance`, but for the keys
    (and what lies under them) that contain `skip`."""
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if skip in str(key):
            continue
        if isinstance(value, dict):
            assert_states_close(got[key], value, tolerance, skip)
        elif isinstance(value, torch.Tensor):
            assert torch.allclose(got[key], value, rtol=0, atol=tolerance), key
        else:
            assert got[key] == value, key


@pytest.mark.slow
def test_fsdp2_sharded_checkpoints_load_on_another_number_of_processes(tmp_path):
    """A sharded checkpoint (`torch.distributed.checkpoint`, as Accelerate writes one for the Trainer) of our model and
    its AdamW state, saved by 2 processes, loads in 1 process and on 3 (which shard the odd dimensions unevenly) into
    exactly the state saved, and the next update there is the one the 2 processes made."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for command in (
        [*torchrun(2), str(DCP_WORKER), str(tmp_path), "save"],
        [sys.executable, str(DCP_WORKER), str(tmp_path), "load"],
        [*torchrun(3), str(DCP_WORKER), str(tmp_path), "load"],
    ):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 0, done.stderr[-4000:]
    saved = torch.load(tmp_path / "save-2.pt", weights_only=True)
    assert saved["checkpoint"]["optimizer"]["state"], "the AdamW state was saved"
    for processes in (1, 3):
        loaded = torch.load(tmp_path / f"load-{processes}.pt", weights_only=True)
        assert_states_close(loaded["checkpoint"], saved["checkpoint"], tolerance=0.0)
        assert abs(loaded["loss"] - saved["loss"]) < 1e-6
        # The key biases' gradients are 0 in exact arithmetic (softmax ignores a constant per query), so their float
        # noise, which differs with the number of processes averaging it, AdamW scales up to whole steps.
        assert_states_close(loaded["after"], saved["after"], tolerance=1e-6, skip="k_proj.bias")


@pytest.mark.parametrize(
    "launcher_variable",
    ["LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE"],
)
def test_the_processes_of_a_node_are_counted_from_the_launchers_variable(monkeypatch, launcher_variable):
    from hf_vanilla.training.recipe import LOCAL_SIZE_VARIABLES, processes_on_this_node

    for variable in LOCAL_SIZE_VARIABLES:  # torchrun, Open MPI, MPICH / Intel MPI, MVAPICH
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(launcher_variable, "4")
    assert processes_on_this_node(16) == 4  # no process group needed: the launcher said it


def count_on_my_node(rank: int, nodes: list[str], port: int, results: Path) -> None:
    """One process of a group whose ranks run on `nodes`, as `srun` starts them: each knows its rank and its node's
    name, not how many share the node."""
    from hf_vanilla.training.recipe import LOCAL_SIZE_VARIABLES, processes_on_this_node

    for variable in LOCAL_SIZE_VARIABLES:
        os.environ.pop(variable, None)
    os.environ["SLURMD_NODENAME"] = nodes[rank]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3)
    (results / f"{rank}").write_text(str(processes_on_this_node(3)))
    torch.distributed.destroy_process_group()


def test_without_a_launchers_variable_the_group_counts_the_processes_of_each_node(tmp_path):
    nodes = ["node-a", "node-a", "node-b"]  # srun's 3 tasks on 2 nodes, simulated on this host
    torch.multiprocessing.spawn(count_on_my_node, args=(nodes, free_port(), tmp_path), nprocs=3)
    assert [int((tmp_path / f"{rank}").read_text()) for rank in range(3)] == [2, 2, 1]
