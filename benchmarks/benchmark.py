"""Speed and memory of hf_vanilla against transformers' MarianMT at identical shape and identical weights.

Both models run in one process, alternately (A B A B ...) after a warm-up, so machine noise hits both alike; results
are medians (with min/max) and ratios hf_vanilla / Marian. The Marian model is random; ours is converted from it,
so both compute the same function and generate the same tokens. Exports of the same weights to other engines are
further columns on the CPU when installed (`pip install 'hf-vanilla[export]'`): CTranslate2 float32, int8 and
int8_float32, and ONNX Runtime (float32, driven by transformers' generate()).

Run from the repository root (the package `benchmarks` is not installed with hf_vanilla):

    python -m benchmarks.benchmark --preset small --threads 2 --repeats 5 --json docs/results/marian-small-cpu.json
    python -m benchmarks.benchmark --preset base --device cuda --dtype bfloat16 --compile
    python -m benchmarks.benchmark --preset small --threads 2 --profile 4   # where the time goes (torch.profiler)
"""

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks import markdown, record
from benchmarks.memory import fresh_process_peak_rss
from benchmarks.synthetic import (
    PRESETS,
    build_models,
    generation_runs,
    source_batch,
    training_runs,
    word_level_tokenizer,
)
from hf_vanilla.inference import static_cache_and_compile


@dataclass
class Measurement:
    name: str
    unit: str
    ours: list[float]
    marian: list[float]
    engines: dict[str, list[float]] | None = None  # exports to other engines, by ENGINE_COLUMNS key

    def row(self) -> dict:
        def summary(values):
            return (
                None if not values else {"median": statistics.median(values), "min": min(values), "max": max(values)}
            )

        ours, marian = statistics.median(self.ours), statistics.median(self.marian)
        higher_is_better = self.unit.endswith("/s")
        result = {
            "name": self.name,
            "unit": self.unit,
            "hf_vanilla": summary(self.ours),
            "marian": summary(self.marian),
            "ratio": ours / marian,
            "better": "higher" if higher_is_better else "lower",
        }
        for column, values in (self.engines or {}).items():
            result[column] = {
                **summary(values),
                "ratio_vs_marian": statistics.median(values) / marian,
            }
        return result


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def alternate(
    runs: dict[str, Callable[[], object]], repeats: int, device: str, warm_up: bool = True
) -> dict[str, list[float]]:
    """One warm-up call each (unless the caller has made one), then A B A B ...: seconds per call for each entry."""
    if warm_up:
        for fn in runs.values():
            fn()
    seconds = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            seconds[name].append(timed(fn, device))
    return seconds


# CTranslate2 columns: the exact export and the two int8 modes that run on a CPU (weights int8; activations float32
# in both, `int8_float32` keeps the non-GEMM weights in float32).
CT2_QUANTIZATIONS = ("float32", "int8", "int8_float32")
# Other-engine columns: result key -> table header.
EXPORT_BACKENDS = {"onnx": "onnxruntime", "openvino": "openvino"}  # our export backend -> the package that runs it
ENGINE_COLUMNS = {f"ctranslate2_{q}": f"CTranslate2 {q}" for q in CT2_QUANTIZATIONS} | {
    "onnxruntime_float32": "ONNX Runtime float32",
    "openvino_float32": "OpenVINO float32",
}


def ctranslate2_runs(ours, vocab: int, inputs, new_tokens: int, num_beams: int, folder: str, quantization: str):
    """A CTranslate2 export of our model (`quantization`), translating the same ids; None without ctranslate2."""
    try:
        import ctranslate2
    except ImportError:
        return None
    from hf_vanilla.interop.ctranslate2 import export_ctranslate2

    tokenizer = word_level_tokenizer(vocab)
    export_ctranslate2(ours.float().cpu(), tokenizer, folder, quantization=quantization, force=True)
    translator = ctranslate2.Translator(folder, device="cpu", inter_threads=1, intra_threads=torch.get_num_threads())
    ids, mask = inputs
    batch = [
        tokenizer.convert_ids_to_tokens(row[m.bool()].tolist()) for row, m in zip(ids.cpu(), mask.cpu(), strict=True)
    ]

    def run():
        return translator.translate_batch(
            batch,
            beam_size=num_beams,
            min_decoding_length=new_tokens,
            max_decoding_length=new_tokens,
            length_penalty=1.0,
        )

    return run


def exported_runs(ours, inputs, new_tokens: int, num_beams: int, folder: str, backend: str):
    """An export of our model through transformers' exporters (`backend`: onnx, openvino), run under generate() with
    the same arguments as the PyTorch models; None without the package that runs it."""
    if importlib.util.find_spec(EXPORT_BACKENDS[backend]) is None:
        return None
    from hf_vanilla.interop.exporters import ExportedVanillaForConditionalGeneration, export_model

    if not os.path.exists(os.path.join(folder, "config.json")):
        export_model(ours.float().cpu(), None, folder, backend=backend, force=True)
    model = ExportedVanillaForConditionalGeneration.from_pretrained(folder, num_threads=torch.get_num_threads())
    return generation_runs({backend: model}, inputs, new_tokens, num_beams)[backend]


def run_benchmark(
    preset: str,
    device: str,
    dtype: torch.dtype,
    repeats: int,
    with_engines: bool,
    export_dir: str,
    with_compile: bool = False,
) -> dict:
    models = build_models(preset, device, dtype)
    ours = models["ours"]
    vocab = PRESETS[preset]["vocab"]
    results: list[Measurement] = []
    batch, length, new_tokens = 16, 32, 64
    tokens_generated = batch * new_tokens

    cases = [("greedy", False, 1, {}), ("beam 4", False, 4, {}), ("greedy, padded mixed lengths", True, 1, {})]
    if with_compile:  # the warm-up call compiles; the timed calls reuse the compiled step
        cases.append(("greedy, static cache + torch.compile", False, 1, static_cache_and_compile()))
    for label, mixed, beams, speed_path in cases:
        inputs = source_batch(batch, length, vocab, device, mixed=mixed)
        runs = generation_runs(models, inputs, new_tokens, beams, **speed_path)
        if with_engines and device == "cpu" and not speed_path:
            for quantization in CT2_QUANTIZATIONS:
                folder = os.path.join(export_dir, f"ctranslate2_{quantization}")
                ct2 = ctranslate2_runs(ours, vocab, inputs, new_tokens, beams, folder, quantization)
                if ct2 is not None:
                    runs[f"ctranslate2_{quantization}"] = ct2
            for backend, runtime in EXPORT_BACKENDS.items():
                folder = os.path.join(export_dir, backend)
                exported = exported_runs(ours, inputs, new_tokens, beams, folder, backend)
                if exported is not None:
                    runs[f"{runtime}_float32"] = exported
        seconds = alternate(runs, repeats, device)
        rate = {name: [tokens_generated / s for s in values] for name, values in seconds.items()}
        engine_rates = {name: values for name, values in rate.items() if name in ENGINE_COLUMNS}
        results.append(
            Measurement(
                f"generation {label}: 16 x 32 -> 64 new",
                "tokens/s",
                rate["ours"],
                rate["marian"],
                engine_rates or None,
            )
        )

    train_tokens = 16 * 32
    seconds = alternate(training_runs(models, 16, 32, 32, vocab, device), repeats, device)
    results.append(
        Measurement(
            "training step (fwd+bwd+AdamW): 16 x 32 x 32",
            "target tokens/s",
            [train_tokens / s for s in seconds["ours"]],
            [train_tokens / s for s in seconds["marian"]],
        )
    )

    inputs = source_batch(batch, length, vocab, device)
    for cache in (True, False):
        for count in (16, 64, 256):
            runs = generation_runs(models, inputs, count, 1, use_cache=cache)
            seconds = alternate(runs, max(3, repeats // 2) if count == 256 else repeats, device)
            results.append(
                Measurement(
                    f"ms per generated token at {count} new, cache {'on' if cache else 'off'}",
                    "ms/token",
                    [1000 * s / count for s in seconds["ours"]],
                    [1000 * s / count for s in seconds["marian"]],
                )
            )

    if device == "cpu":
        for exact, allocator in ((False, "default allocator"), (True, "glibc caching off")):
            memory = fresh_process_peak_rss(preset, str(dtype).replace("torch.", ""), exact_allocator=exact)
            results.append(
                Measurement(
                    f"peak RSS increase, beam 4 generation (fresh process each, {allocator})",
                    "MiB",
                    memory["ours"],
                    memory["marian"],
                )
            )
    else:
        peaks = {}
        for name, fn in generation_runs(models, source_batch(batch, length, vocab, device), new_tokens, 4).items():
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            fn()
            peaks[name] = [(torch.cuda.max_memory_allocated() - before) / 2**20]
        results.append(
            Measurement("peak GPU memory increase, beam 4 generation", "MiB", peaks["ours"], peaks["marian"])
        )

    return {
        "preset": preset,
        "shape": PRESETS[preset],
        "device": device,
        "dtype": str(dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "torch": torch.__version__,
        "results": [m.row() for m in results],
    }


def profile_generation(
    preset: str, num_beams: int, device: str = "cpu", dtype: torch.dtype = torch.float32, row_limit: int = 15
) -> str:
    """torch.profiler's table of the operators that take the time in one generation call, for each model. On a GPU
    it also says how much of the call's wall time the device spent in kernels: the rest is the host's (Python,
    dispatch, launches), where a launch-bound decoding step loses its time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    on_gpu = device.startswith("cuda")
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
    sort_by = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    models = build_models(preset, device, dtype)
    runs = generation_runs(models, source_batch(16, 32, PRESETS[preset]["vocab"], device), 64, num_beams)
    tables = []
    for name, run in runs.items():
        run()  # warm-up
        wall = statistics.median(timed(run, device) for _ in range(3))  # without the profiler's own overhead
        with profile(activities=activities) as profiler:
            run()
        averages = profiler.key_averages()
        lines = [f"## {name}, {num_beams} beam(s): {wall * 1e3:.1f} ms a call"]
        if on_gpu:
            # The kernels' own rows (an operator's row repeats the time of the kernels it launched)
            kernels = sum(e.self_device_time_total for e in averages if e.device_type == DeviceType.CUDA) / 1e3
            launches = sum(event.count for event in averages if event.key in ("cudaLaunchKernel", "cuLaunchKernel"))
            lines.append(
                f"device busy {kernels:.1f} ms ({kernels / (wall * 1e3):.0%} of the wall time), {launches} launches, "
                f"{wall * 1e6 / max(launches, 1):.1f} us of wall time a launch"
            )
        lines.append(averages.table(sort_by=sort_by, row_limit=row_limit, max_name_column_width=32))
        tables.append("\n".join(lines))
    return "\n".join(tables)


def _spread(measured: dict) -> str:
    return f"{measured['median']:.2f} [{measured['min']:.2f}–{measured['max']:.2f}]"


def markdown_table(report: dict) -> str:
    """One row per measurement: both models' median [min–max], their ratio, and the median and ratio of each engine
    that ran (the engines run on the CPU only)."""
    columns = [column for column in ENGINE_COLUMNS if any(row.get(column) for row in report["results"])]
    header = ["measurement", "unit", "hf_vanilla", "MarianMT", "ratio (ours/Marian)"]
    header += [ENGINE_COLUMNS[column] for column in columns]
    rows = []
    for row in report["results"]:
        engines = [row.get(column) for column in columns]
        cells = [row["name"], row["unit"], _spread(row["hf_vanilla"]), _spread(row["marian"])]
        cells.append(f"{row['ratio']:.2f} ({row['better']} is better)")
        cells += [f"{e['median']:.1f} ({e['ratio_vs_marian']:.2f}x Marian)" if e else "—" for e in engines]
        rows.append(cells)
    return markdown(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--no-engines", action="store_true", help="skip the CTranslate2 and ONNX Runtime columns (exports)"
    )
    parser.add_argument(
        "--compile", action="store_true", help="add greedy generation with a static cache + torch.compile (slow start)"
    )
    parser.add_argument("--json", help="also write the results as JSON here")
    parser.add_argument("--profile", type=int, metavar="BEAMS", help="only print torch.profiler tables")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.profile:
        print(profile_generation(args.preset, args.profile, args.device, getattr(torch, args.dtype)))
        return
    with tempfile.TemporaryDirectory() as export_dir:
        report = run_benchmark(
            args.preset,
            args.device,
            getattr(torch, args.dtype),
            args.repeats,
            not args.no_engines,
            export_dir,
            with_compile=args.compile,
        )
    print(
        f"preset {args.preset} {report['shape']}, {args.device} {args.dtype}, {report['threads']} threads, "
        f"torch {report['torch']}, {args.repeats} repeats (median [min-max])\n"
    )
    print(markdown_table(report))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(record("benchmarks.benchmark", [report]), handle, indent=1)


if __name__ == "__main__":
    main()
