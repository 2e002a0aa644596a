"""Peak resident memory of one call: the kernel's exact high-water mark where Linux offers it, a sampling thread
elsewhere, and a fresh process per measurement so the allocator's reuse does not hide what a first call claims."""

import contextlib
import gc
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import psutil
import torch

from benchmarks.synthetic import PRESETS, build_models, generation_runs, source_batch


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
