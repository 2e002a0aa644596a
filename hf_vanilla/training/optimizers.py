"""Muon (`torch.optim.Muon`) for a model's 2-D weight matrices and AdamW for the rest of its parameters, as one
optimizer the Trainer schedules, clips, saves and resumes like any other."""

from collections.abc import Iterable

import torch
from torch import nn
from transformers import PreTrainedModel, TrainingArguments


class MuonWithAdamW(torch.optim.Optimizer):
    """`torch.optim.Muon` over `matrices`, `torch.optim.AdamW` over `others`, stepped together.

    Muon orthogonalises each update of a weight matrix (Newton-Schulz iterations on its momentum): it is defined for
    2-D weights that map hidden states to hidden states, not for embeddings (a lookup by row; ours is tied to the
    output projection), norms or biases, which AdamW keeps. With `adjust_lr_fn="match_rms_adamw"` Muon scales its
    updates to AdamW's root mean square, so one learning rate, one schedule and one weight decay serve both.

    The parameter groups of this optimizer are the two optimizers' own groups (the same dicts), so a learning-rate
    scheduler that sets `lr` in `param_groups` sets both; `state_dict` holds both optimizers' states."""

    def __init__(
        self,
        matrices: Iterable[nn.Parameter],
        others: Iterable[nn.Parameter],
        lr: float,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        momentum: float = 0.95,
    ):
        matrices, others = list(matrices), list(others)
        if not matrices:
            raise ValueError("MuonWithAdamW: no 2-D weight matrices to give Muon; use AdamW alone.")
        muon = torch.optim.Muon(
            matrices, lr=lr, weight_decay=weight_decay, momentum=momentum, adjust_lr_fn="match_rms_adamw"
        )
        adamw = [torch.optim.AdamW(others, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)] if others else []
        self.optimizers: list[torch.optim.Optimizer] = [muon, *adamw]
        super().__init__([*matrices, *others], {"lr": lr})
        self._share_groups()

    def _share_groups(self) -> None:
        # `load_state_dict` gives each optimizer new group dicts: this optimizer must hand out those.
        self.param_groups = [group for optimizer in self.optimizers for group in optimizer.param_groups]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.optimizers:
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("optimizers")
        if saved is None or len(saved) != len(self.optimizers):
            raise ValueError(
                "This optimizer state is not MuonWithAdamW's of the same model (a checkpoint of another optimizer?): "
                "resume with the optimizer the checkpoint was trained with."
            )
        for optimizer, state in zip(self.optimizers, saved, strict=True):
            optimizer.load_state_dict(state)
        self._share_groups()


def muon_with_adamw(model: PreTrainedModel, args: TrainingArguments) -> MuonWithAdamW:
    """Muon for every trainable 2-D weight but the embeddings (input, output, positions), AdamW for those and for
    norms and biases: the learning rate, weight decay, betas and epsilon of `args`."""
    embeddings = {id(module.weight) for module in model.modules() if isinstance(module, nn.Embedding)}
    output = model.get_output_embeddings()
    if output is not None:
        embeddings.add(id(output.weight))
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    matrices = [p for p in trainable if p.ndim == 2 and id(p) not in embeddings]
    others = [p for p in trainable if p.ndim != 2 or id(p) in embeddings]
    return MuonWithAdamW(
        matrices,
        others,
        lr=args.learning_rate,
        weight_decay=args.weight_decay,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
    )
