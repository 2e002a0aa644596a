"""FSDP2 on the CPU: our model (tied embeddings, the chunked label-smoothed loss) sharded with `fully_shard` over the
processes of a gloo group; run under `torchrun --nproc_per_node 2`.

Every rank computes the loss and gradients of the same batch, so the averaged sharded gradients must equal one
process's; then one SGD step, a full state dict saved by rank 0 twice (after one and two steps), and `generate`
with `synced_gpus=True` on batches that finish after different numbers of steps on each rank, the root's
parameters gathered first (`model.unshard()`: generate() calls the encoder and decoder directly, so the root's
forward hook that would gather them never runs). Last, `predict` with `predict_with_generate` and beam search through
`TokenBudgetSeq2SeqTrainer`, as the recipe's evaluation runs it (which must gather the root itself), by a model that
reverses its sources (the folder of argv[3]), on sources whose translations end at different steps on each rank.
Rank 0 writes `<output>/fsdp.json`: the loss, the full gradients, the generated ids and the trainer's predictions.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from benchmarks.synthetic import word_level_tokenizer
from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration


CONFIG = dict(
    vocab_size=61, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, dropout=0.0,
)  # fmt: skip
LOSS = {"label_smoothing": 0.1, "loss_chunk_size": 4}


def build_model() -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(0)
    config = VanillaTransformerConfig(**CONFIG)
    config._attn_implementation = "eager"
    return VanillaTransformerForConditionalGeneration(config)


def batch():
    input_ids = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0], [11, 12, 13, 2, 0]])
    labels = torch.tensor([[20, 21, 22, 2], [23, 2, -100, -100], [24, 25, 26, 2]])
    return {"input_ids": input_ids, "attention_mask": input_ids.ne(0).long(), "labels": labels}


def full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def step(model) -> tuple[float, dict]:
    outputs = model.train()(**batch(), **LOSS)
    outputs.loss.backward()
    gradients = {name: full(p.grad).tolist() for name, p in model.named_parameters() if p.grad is not None}
    return outputs.loss.item(), gradients


def full_state_dict(model, sharded: bool) -> dict[str, torch.Tensor]:
    """What a FULL_STATE_DICT checkpoint holds: every weight whole, copied to the CPU."""
    if sharded:
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def shard(model) -> None:
    for layer in [*model.model.encoder.layers, *model.model.decoder.layers]:
        fully_shard(layer)
    fully_shard(model)


def predict_through_the_trainer(reversal_model: Path, output: Path, sharded: bool) -> list[list[int]]:
    """A model that reverses its sources translates 4 of them as the recipe's evaluation does (`predict` with
    `predict_with_generate` and beam search), one a batch, dealt to the processes in turn: with 2, rank 0 gets the
    1-id sources (done after 2 steps) and rank 1 the 7-id ones (8 steps), so rank 0 must keep stepping with rank 1."""
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

    from hf_vanilla.training import TokenBudgetSeq2SeqTrainer

    model = VanillaTransformerForConditionalGeneration.from_pretrained(reversal_model).eval()
    if sharded:
        shard(model)
    sources = [[5, 2], [6, 7, 8, 9, 10, 11, 12, 2], [9, 2], [13, 14, 15, 16, 17, 18, 19, 2]]
    args = Seq2SeqTrainingArguments(
        output_dir=str(output / "predict"), use_cpu=True, report_to=[], per_device_eval_batch_size=1,
        predict_with_generate=True,
    )  # fmt: skip
    trainer = TokenBudgetSeq2SeqTrainer(
        model=model,
        args=args,
        data_collator=DataCollatorForSeq2Seq(word_level_tokenizer(model.config.vocab_size), model=model),
        max_tokens=64,
    )
    dataset = Dataset.from_dict({"input_ids": sources, "labels": [list(reversed(ids)) for ids in sources]})
    return trainer.predict(dataset, num_beams=3, max_length=10).predictions.tolist()


def main(output: Path, sharded: bool, reversal_model: Path) -> None:
    model = build_model()
    if sharded:
        dist.init_process_group("gloo")
        shard(model)
    loss, gradients = step(model)
    # SGD: Adam would turn the float noise of gradients that are zero in exact arithmetic (the key biases) into
    # whole steps of the learning rate, in either direction
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.step()
    states = [full_state_dict(model, sharded)]
    optimizer.zero_grad()
    step(model)
    optimizer.step()
    states.append(full_state_dict(model, sharded))
    rank = dist.get_rank() if sharded else 0
    sources = [[5, 6, 7, 2], [9, 10, 11, 12, 13, 14, 15, 2]][rank % 2 : rank % 2 + 1]  # other lengths per rank
    if sharded:
        # generate() calls the encoder and decoder directly, not the root module whose forward would all-gather the
        # root's parameters (the tied embeddings, the final norms): gather them for the whole generation.
        model.unshard()
    with torch.no_grad():
        generated = model.eval().generate(
            input_ids=torch.tensor(sources), max_new_tokens=4 + 6 * (rank % 2), num_beams=1, synced_gpus=sharded
        )
    if sharded:
        model.reshard()
    predictions = predict_through_the_trainer(reversal_model, output, sharded)
    if rank == 0:
        reference = build_model()
        for number, state in enumerate(states, start=1):  # what a FULL_STATE_DICT checkpoint holds, saved as users do
            reference.load_state_dict(state)
            reference.save_pretrained(output / f"step-{number}")
        result = {"loss": loss, "gradients": gradients, "generated": generated.tolist(), "predictions": predictions}
        (output / "fsdp.json" if sharded else output / "single.json").write_text(json.dumps(result))
    if sharded:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sharded=sys.argv[2] == "sharded", reversal_model=Path(sys.argv[3]))
