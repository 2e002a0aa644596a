"""The order in which pytest-xdist hands the suite's files to its workers (`--dist loadfile`, a file to a worker).

Its own order (by number of tests, largest first) puts a file of one long test, as the elastic-resume test is, near
the end, where it runs alone while the other workers have finished. Here the files with the most slow tests (marked
`slow`) go first and the rest follow by number of tests, so that the long files run while the short ones fill the
other workers. pyproject.toml's `--no-loadscope-reorder` makes pytest-xdist keep this order."""

from collections import Counter

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.pluginmanager.hasplugin("randomly"):  # a run in random order (docs/testing.md) keeps it
        return
    slow_tests, tests = Counter(), Counter()
    for item in items:
        tests[item.path] += 1
        slow_tests[item.path] += item.get_closest_marker("slow") is not None
    # A stable sort: a file's tests stay together and in their order.
    items.sort(key=lambda item: (-slow_tests[item.path], -tests[item.path]))
