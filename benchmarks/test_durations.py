"""Where the test suite's and CI's time goes: seconds per test file and the slowest tests, read from pytest's JUnit
XML report of a run (`--junitxml`, or `PYTEST_ADDOPTS=--junitxml=...` beside a command that must stay as written),
and seconds per phase of `.ci/run`, read from its log (each step prints `== NAME (N s into CI)`), so the next cut is
chosen from data. Each run is recorded with the commit it tested.

    python -m benchmarks.test_command --junit /work/after.xml   # the README's command; keeps its report
    bash .ci/run | tee /work/ci.log
    python -m benchmarks.test_durations --run before d6f7dae /work/before.xml --run after HEAD /work/after.xml \\
        --ci after HEAD /work/ci.log --json docs/results/test-durations-cpu.json

A test's time is its setup, call and teardown together (pytest's default `junit_duration_report`), so a fixture that
builds something for many tests counts in the first test that asks for it. With pytest-xdist the tests' times add up
to more than the run's wall time: the workers run side by side.
"""

import argparse
import json
import re
import subprocess
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

from benchmarks import ROOT, markdown, record


SLOWEST = 15


def durations(report: Path) -> dict:
    """A JUnit XML report's wall time, outcome counts, seconds per test file and the slowest tests."""
    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    per_file: dict[str, list[float]] = defaultdict(list)
    tests = []
    for case in suite.iter("testcase"):
        seconds = float(case.get("time", 0))
        file = case.get("classname", "").split(".")[0:2]  # "tests.test_x" or "tests.test_x.TestClass"
        per_file["/".join(file) + ".py"].append(seconds)
        tests.append((seconds, f"{case.get('classname')}::{case.get('name')}"))
    files = sorted(per_file.items(), key=lambda item: -sum(item[1]))
    return {
        "wall_s": round(float(suite.get("time", 0)), 1),
        "tests": int(suite.get("tests", 0)),
        "skipped": int(suite.get("skipped", 0)),
        "failures": int(suite.get("failures", 0)) + int(suite.get("errors", 0)),
        "sum_of_tests_s": round(sum(seconds for seconds, _ in tests), 1),
        "files": [{"file": name, "tests": len(times), "seconds": round(sum(times), 1)} for name, times in files],
        "slowest": [{"test": name, "seconds": round(seconds, 1)} for seconds, name in sorted(tests)[::-1][:SLOWEST]],
    }


def ci_phases(log: Path) -> dict:
    """Each step of a `.ci/run` log with its seconds, from its start to the next step's; the last step ends CI."""
    marks = [
        (name, int(at)) for name, at in re.findall(r"^== (.*) \((\d+) s into CI\)$", log.read_text(), re.MULTILINE)
    ]
    if not marks or marks[-1][0] != "CI passed":
        raise SystemExit(f"{log}: not the log of a CI run that passed")
    phases = [{"phase": name, "seconds": end - start} for (name, start), (_, end) in pairwise(marks)]
    return {"ci_s": marks[-1][1], "phases": phases}


def table(results: list[dict]) -> str:
    """Seconds per test file, a column per run, the slowest file first; then each run's slowest tests."""
    labels = [result["run"] for result in results]
    seconds = {result["run"]: {f["file"]: f["seconds"] for f in result["files"]} for result in results}

    def slowest_first(f: str) -> tuple[float, str]:  # by the file's longest time in any run, then by name
        return -max(run.get(f, 0) for run in seconds.values()), f

    files = sorted({f for run in seconds.values() for f in run}, key=slowest_first)
    rows = [
        [f"`{f}`", *(f"{seconds[label][f]:.1f}" if f in seconds[label] else "-" for label in labels)] for f in files
    ]
    rows.append(["sum of the tests' times", *(f"{r['sum_of_tests_s']:.1f}" for r in results)])
    rows.append(["**wall time of the run**", *(f"**{r['wall_s']:.1f}**" for r in results)])
    header = ["test file (setup, call and teardown, s)", *(f"{r['run']} ({r['commit'][:7]})" for r in results)]
    slowest = []
    for result in results:
        names = ", ".join(f"`{t['test'].split('::', 1)[1]}` {t['seconds']:.0f} s" for t in result["slowest"][:8])
        slowest.append(f"Slowest tests, {result['run']}: {names}.")
    return markdown(header, rows) + "\n\n" + "\n\n".join(slowest)


def ci_table(result: dict) -> str:
    """The phases of one CI run, in order, and its total."""
    rows = [[phase["phase"], str(phase["seconds"])] for phase in result["phases"]]
    rows.append(["**the whole of `.ci/run`**", f"**{result['ci_s']}**"])
    return markdown([f"phase of `.ci/run`, {result['run']} ({result['commit'][:7]})", "seconds"], rows)


def resolve(commit: str) -> str:
    return subprocess.run(
        ["git", "rev-parse", commit], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--run", nargs=3, action="append", required=True, metavar=("LABEL", "COMMIT", "JUNIT_XML"),
        help="a run's label, the commit it tested and its JUnit XML report; repeat for each run",
    )  # fmt: skip
    parser.add_argument(
        "--ci", nargs=3, action="append", default=[], metavar=("LABEL", "COMMIT", "CI_LOG"),
        help="a CI run's label, the commit it ran and the log of its .ci/run",
    )  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = [{"run": label, "commit": resolve(commit), **durations(Path(xml))} for label, commit, xml in args.run]
    ci = [{"run": label, "commit": resolve(commit), **ci_phases(Path(log))} for label, commit, log in args.ci]
    print(table(results), *map(ci_table, ci), sep="\n\n")
    if args.json:
        args.json.write_text(json.dumps(record("benchmarks.test_durations", results + ci), indent=1) + "\n")


if __name__ == "__main__":
    main()
