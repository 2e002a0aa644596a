"""Benchmark hf_vanilla against MarianMT of identical shape and weights, in one process, alternating A B A B.

python scripts/benchmark.py --preset small --threads 2 --repeats 5 --json runs/benchmark_small.json
python scripts/benchmark.py --preset base --device cuda --dtype bfloat16 --compile
python scripts/benchmark.py --preset small --threads 2 --profile 4   # where the time goes (torch.profiler)
"""

import argparse
import tempfile

import torch

from hf_vanilla.benchmarking import PRESETS, markdown_table, profile_generation, run_benchmark, save_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-ctranslate2", action="store_true", help="skip the CTranslate2 column")
    parser.add_argument(
        "--compile", action="store_true", help="add greedy generation with a static cache + torch.compile (slow start)"
    )
    parser.add_argument("--json", help="also write the results as JSON here")
    parser.add_argument("--profile", type=int, metavar="BEAMS", help="only print torch.profiler tables (CPU)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.profile:
        print(profile_generation(args.preset, args.profile))
        return
    with tempfile.TemporaryDirectory() as ct2_dir:
        report = run_benchmark(
            args.preset,
            args.device,
            getattr(torch, args.dtype),
            args.repeats,
            not args.no_ctranslate2,
            ct2_dir,
            with_compile=args.compile,
        )
    print(
        f"preset {args.preset} {report['shape']}, {args.device} {args.dtype}, {report['threads']} threads, "
        f"torch {report['torch']}, {args.repeats} repeats (median [min-max])\n"
    )
    print(markdown_table(report))
    if args.json:
        save_report(report, args.json)


if __name__ == "__main__":
    main()
