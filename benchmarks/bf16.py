"""float32 against bf16 autocast on this CPU: a training step and a translation, for the tiny, quickstart and base
presets, alternating the two precisions so that a drift of the machine hits both alike.

    python -m benchmarks.bf16 --json docs/results/bf16-cpu.json

A training step is a forward and backward of 32 pairs of 32 tokens with the chunked label-smoothed loss our trainer
asks for, and an AdamW step (what `--bf16 true` runs on a CPU: the forward under autocast, float32 weights); a
translation is greedy `generate()` of 16 sources of 32 tokens to 32 new tokens.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks import ROOT, record
from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla.training.arguments import bf16_hardware


PRESETS = {"tiny": "configs/tiny.json", "quickstart": "configs/quickstart_model.json", "base": "configs/base.json"}
VOCAB = 8000


def build(preset: str) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_json_file(ROOT / PRESETS[preset])
    config.vocab_size = config.decoder_vocab_size = VOCAB
    return VanillaTransformerForConditionalGeneration(config)


def training_step(model, optimizer, bf16: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(4, VOCAB, (32, 32), generator=generator)
    labels = torch.randint(4, VOCAB, (32, 32), generator=generator)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(input_ids=input_ids, labels=labels, label_smoothing=0.1, loss_chunk_size=1024).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def translation(model, bf16: bool) -> None:
    input_ids = torch.randint(4, VOCAB, (16, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        model.generate(input_ids=input_ids, num_beams=1, min_new_tokens=32, max_new_tokens=32)


def seconds(work, repeats: int) -> dict[str, list[float]]:
    """Wall times of `work(bf16)` for both precisions, alternating, after one warm-up call each."""
    times = {"float32": [], "bf16": []}
    for bf16 in (False, True):
        work(bf16)
    for _ in range(repeats):
        for name, bf16 in (("float32", False), ("bf16", True)):
            start = time.perf_counter()
            work(bf16)
            times[name].append(time.perf_counter() - start)
    return times


def measure(preset: str, repeats: int) -> dict:
    model = build(preset)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    steps = seconds(lambda bf16: training_step(model.train(), optimizer, bf16), repeats)
    translations = seconds(lambda bf16: translation(model.eval(), bf16), repeats)
    result = {"preset": preset, "parameters": sum(p.numel() for p in model.parameters())}
    for name, times in (("training_step", steps), ("translation", translations)):
        medians = {precision: statistics.median(values) for precision, values in times.items()}
        result[name] = {"seconds": times, "median_s": medians, "bf16_speedup": medians["float32"] / medians["bf16"]}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    for preset in args.presets:
        result = measure(preset, args.repeats)
        print(json.dumps({k: v for k, v in result.items() if k != "seconds"}), flush=True)
        results.append(result)
    document = record("benchmarks.bf16", results, native_bf16=bf16_hardware())
    if args.json:
        args.json.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
