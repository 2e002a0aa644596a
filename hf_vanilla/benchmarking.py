"""Speed and memory of hf_vanilla against transformers' MarianMT at identical shape and identical weights.

Both models run in one process, alternately (A B A B ...) after a warm-up, so machine noise hits both alike; results
are medians (with min/max) and ratios hf_vanilla / Marian. The Marian model is random; ours is converted from it,
so both compute the same function and generate the same tokens. CTranslate2 (float32 export of the same weights)
is a third column when installed.
"""

import contextlib
import gc
import json
import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import psutil
import torch
from transformers import CompileConfig, MarianConfig, MarianMTModel

from .conversion import convert_marian


PRESETS = {
    "small": dict(d_model=256, layers=3, heads=4, ffn=1024, vocab=8000),
    "base": dict(d_model=512, layers=6, heads=8, ffn=2048, vocab=32000),
}


@dataclass
class Measurement:
    name: str
    unit: str
    ours: list[float]
    marian: list[float]
    ct2: list[float] | None = None

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
        if self.ct2:
            result["ctranslate2"] = summary(self.ct2)
            result["ratio_ct2_vs_marian"] = statistics.median(self.ct2) / marian
        return result


def build_models(preset: str, device: str, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.nn.Module]:
    """{"ours": ..., "marian": ...}: a random MarianMT model and ours converted from it, in eval mode."""
    shape = PRESETS[preset]
    config = MarianConfig(
        vocab_size=shape["vocab"],
        d_model=shape["d_model"],
        encoder_layers=shape["layers"],
        decoder_layers=shape["layers"],
        encoder_attention_heads=shape["heads"],
        decoder_attention_heads=shape["heads"],
        encoder_ffn_dim=shape["ffn"],
        decoder_ffn_dim=shape["ffn"],
        activation_function="relu",
        scale_embedding=True,
        max_position_embeddings=1024,
        pad_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=1,
        dropout=0.1,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    marian = MarianMTModel(config)
    ours = convert_marian(marian)
    return {"ours": ours.to(device, dtype).eval(), "marian": marian.to(device, dtype).eval()}


def source_batch(batch: int, length: int, vocab: int, device: str, mixed: bool = False, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    if mixed:  # lengths spread from 8 to `length`, right-padded
        for row, n in enumerate(torch.linspace(8, length, batch).round().long().tolist()):
            ids[row, n:] = 0
            mask[row, n:] = 0
    ids[torch.arange(batch), mask.sum(1) - 1] = 2  # each source ends in EOS
    return ids.to(device), mask.to(device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def alternate(runs: dict[str, Callable[[], object]], repeats: int, device: str) -> dict[str, list[float]]:
    """One warm-up call each, then A B A B ...: seconds per call for each entry."""
    for fn in runs.values():
        fn()
    seconds = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            seconds[name].append(timed(fn, device))
    return seconds


def static_cache_and_compile() -> dict:
    """generate()'s own speed path: a static cache and its decoding step compiled with torch.compile (fullgraph).
    transformers turns the compilation on only on accelerators unless asked, so the CPU is asked explicitly.
    Only greedy and sampling compile; beam search runs the step eagerly."""
    config = CompileConfig(fullgraph=True, dynamic=False)
    config._compile_all_devices = True
    return dict(cache_implementation="static", compile_config=config)


def generation_runs(models, inputs, new_tokens: int, num_beams: int, use_cache: bool = True, **generate_kwargs):
    ids, mask = inputs
    kwargs = dict(
        input_ids=ids,
        attention_mask=mask,
        min_new_tokens=new_tokens,
        max_new_tokens=new_tokens,
        num_beams=num_beams,
        do_sample=False,
        length_penalty=1.0,
        use_cache=use_cache,
        **generate_kwargs,
    )

    def run(model):
        with torch.inference_mode():
            return model.generate(**kwargs)

    return {name: (lambda m=model: run(m)) for name, model in models.items()}


def training_runs(models, batch: int, source_length: int, target_length: int, vocab: int, device: str):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(4, vocab, (batch, source_length), generator=generator).to(device)
    labels = torch.randint(4, vocab, (batch, target_length), generator=generator).to(device)
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in models.items()}

    def step(name):
        model = models[name]
        model.train()
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
        loss.backward()
        optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)
        model.eval()

    return {name: (lambda n=name: step(n)) for name in models}


def _reset_kernel_peak_rss() -> bool:
    """Reset the kernel's exact high-water mark of resident memory (VmHWM) to the current RSS; False where the
    kernel does not offer it (not Linux, or Linux < 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


def _read_vm_hwm() -> int:
    with open("/proc/self/status") as handle:
        line = next(line for line in handle if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def peak_rss_increase(fn: Callable[[], object], interval: float = 0.002) -> float:
    """Peak resident memory (MiB) of `fn` above the level before it.

    On Linux the kernel keeps the exact peak (VmHWM, reset first); elsewhere a background thread samples RSS every
    `interval` seconds, which can miss short spikes."""
    process = psutil.Process()
    gc.collect()
    baseline = process.memory_info().rss
    if _reset_kernel_peak_rss():
        fn()
        return (_read_vm_hwm() - baseline) / 2**20
    peak = baseline
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, process.memory_info().rss)
            time.sleep(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        fn()
    finally:
        done.set()
        sampler.join()
    return (max(peak, process.memory_info().rss) - baseline) / 2**20


def _generation_peak_in_this_process(name: str, preset: str, dtype: str, threads: int, num_beams: int) -> float:
    torch.set_num_threads(threads)
    models = build_models(preset, "cpu", getattr(torch, dtype))
    model = models.pop(name)
    del models
    gc.collect()
    vocab = PRESETS[preset]["vocab"]
    run = generation_runs({name: model}, source_batch(16, 32, vocab, "cpu"), 64, num_beams)[name]
    return peak_rss_increase(run)


# glibc returns every block above 128 KiB to the system at once instead of keeping freed memory for reuse: the peak
# then shows what the model itself holds at its fullest, not where the allocator's adaptive thresholds happened to be.
EXACT_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


@contextlib.contextmanager
def _environment(variables: dict[str, str]):
    saved = {key: os.environ.get(key) for key in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value


def fresh_process_peak_rss(
    preset: str, dtype: str, repeats: int = 5, num_beams: int = 4, exact_allocator: bool = False
) -> dict[str, list[float]]:
    """Peak RSS increase (MiB) of one generation call, each model in its own fresh process, alternating.

    In a process that has already generated, the allocator reuses memory it holds and the increase reads ~0; a
    fresh process per measurement sees what a first call really claims. With the default allocator the figure
    also moves with glibc's adaptive thresholds (+-10 MiB run to run); `exact_allocator` pins them
    (`EXACT_ALLOCATOR_ENV`) for a repeatable comparison of the models. CPU only (RSS is host memory)."""
    peaks = {"ours": [], "marian": []}
    context = multiprocessing.get_context("spawn")
    with _environment(EXACT_ALLOCATOR_ENV if exact_allocator else {}):
        for _ in range(repeats):
            for name in peaks:
                with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
                    job = pool.submit(
                        _generation_peak_in_this_process, name, preset, dtype, torch.get_num_threads(), num_beams
                    )
                    peaks[name].append(job.result())
    return peaks


def ctranslate2_runs(ours, vocab: int, inputs, new_tokens: int, num_beams: int, folder: str):
    """A float32 CTranslate2 export of our model, translating the same ids; None without ctranslate2."""
    try:
        import ctranslate2
    except ImportError:
        return None
    from .export import export_ctranslate2
    from .tokenization import word_level_tokenizer

    tokenizer = word_level_tokenizer(vocab)
    export_ctranslate2(ours.float().cpu(), tokenizer, folder, force=True)
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


def run_benchmark(
    preset: str,
    device: str,
    dtype: torch.dtype,
    repeats: int,
    with_ct2: bool,
    ct2_dir: str,
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
        if with_ct2 and device == "cpu" and not speed_path:
            ct2 = ctranslate2_runs(ours, vocab, inputs, new_tokens, beams, ct2_dir)
            if ct2 is not None:
                runs["ct2"] = ct2
        seconds = alternate(runs, repeats, device)
        rate = {name: [tokens_generated / s for s in values] for name, values in seconds.items()}
        results.append(
            Measurement(
                f"generation {label}: 16 x 32 -> 64 new", "tokens/s", rate["ours"], rate["marian"], rate.get("ct2")
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


def profile_generation(preset: str, num_beams: int, row_limit: int = 15) -> str:
    """torch.profiler's table of the operators that take the time in one generation call, for each model."""
    from torch.profiler import ProfilerActivity, profile

    models = build_models(preset, "cpu", torch.float32)
    runs = generation_runs(models, source_batch(16, 32, PRESETS[preset]["vocab"], "cpu"), 64, num_beams)
    tables = []
    for name, run in runs.items():
        run()  # warm-up
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
            run()
        averages = profiler.key_averages(group_by_input_shape=True)
        table = averages.table(sort_by="self_cpu_time_total", row_limit=row_limit, max_name_column_width=32)
        tables.append(f"## {name}, {num_beams} beam(s)\n{table}")
    return "\n".join(tables)


def markdown_table(report: dict) -> str:
    header = (
        "| measurement | unit | hf_vanilla | MarianMT | ratio (ours/Marian) | CTranslate2 |\n|---|---|---|---|---|---|"
    )
    lines = [header]
    for row in report["results"]:
        ct2 = row.get("ctranslate2")
        ct2_text = f"{ct2['median']:.1f} ({row['ratio_ct2_vs_marian']:.2f}x Marian)" if ct2 else "—"
        lines.append(
            f"| {row['name']} | {row['unit']} | {row['hf_vanilla']['median']:.2f} "
            f"[{row['hf_vanilla']['min']:.2f}–{row['hf_vanilla']['max']:.2f}] | {row['marian']['median']:.2f} "
            f"[{row['marian']['min']:.2f}–{row['marian']['max']:.2f}] | {row['ratio']:.2f} "
            f"({row['better']} is better) | {ct2_text} |"
        )
    return "\n".join(lines)


def save_report(report: dict, json_path: str) -> None:
    with open(json_path, "w") as handle:
        json.dump(report, handle, indent=2)
