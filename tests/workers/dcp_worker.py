"""FSDP2's sharded checkpoint on another number of processes: our model (tied embeddings, the chunked label-smoothed
loss) and its AdamW state saved by `torch.distributed.checkpoint` on the processes of one launch, loaded on another
count, as Accelerate's `save_fsdp_model`/`save_fsdp_optimizer` and their `load_` twins do it for the Trainer with
`SHARDED_STATE_DICT` (folders `pytorch_model_fsdp_0` and `optimizer_0`, keys "model" and "optimizer").

    torchrun --nproc_per_node N dcp_worker.py OUTPUT save   two updates, the checkpoint, then a third update
    torchrun --nproc_per_node M dcp_worker.py OUTPUT load   the checkpoint loaded, then the third update
    python dcp_worker.py OUTPUT load                        the same in one process, unsharded

Every process computes the loss of the same batch, so the sharded run's update is one process's. Rank 0 writes, with
`torch.save`, `<mode>-<processes>.pt`: the full model and optimizer state dicts at the checkpoint ("checkpoint": after
the second update, or as loaded) and after the third update ("after"), and the third update's loss.
"""

import copy
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fsdp_worker import build_model, shard, step  # this script's folder comes first on sys.path
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)


FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def update(model, optimizer) -> float:
    optimizer.zero_grad()
    loss, _ = step(model)
    optimizer.step()
    return loss


# Accelerate's folders for the two parts of a sharded checkpoint, each saved under its part's key
FOLDERS = {"model": "pytorch_model_fsdp_0", "optimizer": "optimizer_0"}


def state_dicts(model, optimizer, options: StateDictOptions | None = None) -> dict:
    """The model's and the optimizer's state dicts: each process's shards, or with `FULL` the whole of them."""
    return {
        "model": get_model_state_dict(model, options=options),
        "optimizer": get_optimizer_state_dict(model, optimizer, options=options),
    }


def full_state(model, optimizer) -> dict:
    """The whole model and optimizer state, copied: in one process the state dicts hold the live tensors."""
    return copy.deepcopy(state_dicts(model, optimizer, FULL))


def save(model, optimizer, folder: Path) -> None:
    states = state_dicts(model, optimizer)
    for part, name in FOLDERS.items():
        dcp.save({part: states[part]}, storage_writer=dcp.FileSystemWriter(folder / name))


def load(model, optimizer, folder: Path) -> None:
    states = state_dicts(model, optimizer)
    for part, name in FOLDERS.items():  # in place: each part's tensors and values are overwritten
        dcp.load({part: states[part]}, storage_reader=dcp.FileSystemReader(folder / name))
    set_model_state_dict(model, states["model"])
    set_optimizer_state_dict(model, optimizer, states["optimizer"])


def main(output: Path, mode: str) -> None:
    sharded = "WORLD_SIZE" in os.environ  # under torchrun
    if sharded:
        dist.init_process_group("gloo")
    model = build_model()
    if sharded:
        shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checkpoint = output / "checkpoint"
    if mode == "save":
        update(model, optimizer)
        update(model, optimizer)
        save(model, optimizer, checkpoint)
    else:
        load(model, optimizer, checkpoint)
    result = {"checkpoint": full_state(model, optimizer)}
    result["loss"] = update(model, optimizer)
    result["after"] = full_state(model, optimizer)
    if not sharded or dist.get_rank() == 0:
        processes = dist.get_world_size() if sharded else 1
        torch.save(result, output / f"{mode}-{processes}.pt")
    if sharded:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
