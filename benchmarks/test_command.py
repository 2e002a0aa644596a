"""The README's test command as a new user runs it: a fresh clone of the committed code, a new virtual environment,
the installs, then the tests; the installs and the tests timed apart.

    python -m benchmarks.test_command --json docs/results/test-command-cpu.json [--junit /work/tests.xml]

The command is read from the README (the set-up block that runs pytest), so the figure is the command's own.
`--junit` keeps pytest's JUnit XML report of the run (through `PYTEST_ADDOPTS`, so the command stays as written),
for `benchmarks.test_durations`.
"""

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks import fresh_clone, record
from benchmarks.readme import readme_command


TESTS = " && python -m pytest -q"


def timed(command: str, cwd: Path, log: Path, env: dict | None = None) -> tuple[float, str]:
    started = time.perf_counter()
    result = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, env=env)
    log.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"{command!r} failed ({result.returncode}); its output: {log}")
    return time.perf_counter() - started, result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--junit", type=Path, help="keep the run's JUnit XML report here")
    args = parser.parse_args()
    command = readme_command("tests")
    if not command.endswith(TESTS):
        raise SystemExit(f"README.md: the test command should end with {TESTS!r}: {command!r}")
    installs = command.removesuffix(TESTS)
    with tempfile.TemporaryDirectory() as scratch:
        clone = fresh_clone(Path(scratch))
        install_s, _ = timed(installs, clone, Path(scratch) / "installs.log")
        env = {**os.environ, "PYTEST_ADDOPTS": f"--junitxml={args.junit.resolve()}"} if args.junit else None
        tests_s, output = timed(f". .venv/bin/activate{TESTS}", clone, Path(scratch) / "tests.log", env)
        summary = re.findall(r"^=*\s*(\d+ passed.*) in [\d.]+s", output, re.MULTILINE)[-1]
        result = {
            "command": command,
            "installs_s": round(install_s, 1),
            "tests_s": round(tests_s, 1),
            "passed": int(summary.split()[0]),
            "summary": summary,
        }
        print(json.dumps(result))
        if args.json:
            document = record("benchmarks.test_command", [result], checkout=clone)
            args.json.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
