"""The SIGSEGV reproducer of docs/robustness.md: loader workers started in a process where tests/test_exporters.py
has run ONNX Runtime and OpenVINO sessions. Not collected by the suite (no `test_` file name); run it explicitly:

    python -m pytest -q tests/test_exporters.py tests/workers/loader_workers_probe.py \
        -k "generate_without_cache or export_refuses or missing_optional or loader_workers"

Its test passes alone and in a fresh process; after those exporter tests the process ends in SIGSEGV (rc 139)."""

from torch.utils.data import DataLoader


def test_loader_workers_start_fetch_and_stop():
    for context in ("fork", "spawn"):
        loader = DataLoader(
            list(range(64)), batch_size=8, num_workers=2, persistent_workers=True, multiprocessing_context=context
        )
        for _ in range(2):
            assert sum(int(batch.sum()) for batch in loader) == 2016
        del loader
