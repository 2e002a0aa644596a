"""Memory of `hf-vanilla translate` on long files: it must follow the buffer, not the file.

Writes files of N lines (Multi30k sentences, every 10th line blank, one line of invalid UTF-8 near the end), runs
the real command on each with `--errors replace`, and records the command's peak resident memory (the kernel's
VmHWM), its wall time, and whether the output is aligned: as many lines as the input, blank wherever the input is
blank. The model is a small random one with a short budget (a memory test, not a quality one), so 200k lines take
minutes on a CPU.

    python -m benchmarks.translate_memory --lines 20000 200000 --json docs/results/translate-memory-cpu.json
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import record
from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla.data import BUNDLED_CORPORA
from hf_vanilla.text_files import stream_lines
from hf_vanilla.tokenization import train_bpe_tokenizer


def small_model_folder(folder: Path) -> Path:
    """A 2+2-layer random model over a 2000-entry BPE of Multi30k English that never ends a translation early, saved
    with its tokenizer."""
    multi30k, _ = BUNDLED_CORPORA["multi30k"]
    tokenizer = train_bpe_tokenizer(list(stream_lines(multi30k / "train.en.gz")), vocab_size=2000, show_progress=False)
    torch.manual_seed(0)
    config = VanillaTransformerConfig(
        vocab_size=len(tokenizer),
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        add_final_logits_bias=True,
    )
    model = VanillaTransformerForConditionalGeneration(config)
    with torch.no_grad():  # never a special token: every translation has its 4 tokens, none comes out empty
        model.final_logits_bias[0, : len(tokenizer.all_special_ids)] = -1e4
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_input(path: Path, lines: int) -> list[int]:
    """`lines` lines: Multi30k sentences, every 10th blank, line `lines - 5` invalid UTF-8. Returns the blank ones."""
    multi30k, _ = BUNDLED_CORPORA["multi30k"]
    sentences = list(stream_lines(multi30k / "train.en.gz"))
    blank = [i for i in range(lines) if i % 10 == 9]
    with open(path, "wb") as handle:
        for i in range(lines):
            if i % 10 == 9:
                handle.write(b"\n")
            elif i == lines - 5:
                handle.write(b"A broken \xff\xfe line.\n")
            else:
                handle.write(sentences[i % len(sentences)].encode() + b"\n")
    return blank


def measure(model: Path, lines: int, scratch: Path) -> dict:
    source, output = scratch / f"in-{lines}.txt", scratch / f"out-{lines}.txt"
    blank = write_input(source, lines)
    command = [sys.executable, "-m", "hf_vanilla", "translate", str(model), "--input", str(source)]
    command += ["--output", str(output), "--errors", "replace", "--beam", "1", "--max-len-a", "0", "--max-len-b", "4"]
    command += ["--no-progress"]
    start = time.monotonic()
    process = subprocess.Popen(command, stderr=subprocess.PIPE)
    peak = 0
    while process.poll() is None:
        try:
            with open(f"/proc/{process.pid}/status") as handle:
                peak = max(peak, next(int(line.split()[1]) for line in handle if line.startswith("VmHWM:")) * 1024)
        except (OSError, StopIteration):
            pass
        time.sleep(0.1)
    seconds = time.monotonic() - start
    if process.returncode != 0:
        raise RuntimeError(process.stderr.read().decode()[-3000:])
    written = output.read_text(encoding="utf-8").split("\n")[:-1]
    return {
        "lines": lines,
        "peak_rss_mib": round(peak / 2**20, 1),
        "seconds": round(seconds, 1),
        "lines_per_second": round(lines / seconds, 1),
        "output_lines": len(written),
        # line for line: as many lines, every blank input line blank in the output (a translation may be empty too)
        "aligned": len(written) == lines and all(not written[i] for i in blank),
        "empty_translations_of_nonblank_lines": sum(not text for text in written) - len(blank),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = small_model_folder(Path(scratch) / "model")
        results = [measure(model, lines, Path(scratch)) for lines in args.lines]
    for result in results:
        print(json.dumps(result))
    largest, smallest = results[-1]["peak_rss_mib"], results[0]["peak_rss_mib"]
    print(f"peak RSS {args.lines[-1]} lines / {args.lines[0]} lines: {largest / smallest:.3f}")
    if args.json:
        report = record("benchmarks.translate_memory", results)
        report["peak_rss_ratio_largest_to_smallest"] = round(largest / smallest, 3)
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
