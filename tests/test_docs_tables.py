"""The results tables of README.md and docs/ are what `benchmarks.report` renders from docs/results: every figure
there traces to a JSON with its commit, machine and command."""

import pytest

from benchmarks import report


@pytest.mark.parametrize("path", report.DOCUMENTS, ids=lambda path: path.name)
def test_every_results_table_is_its_rendering(path):
    text = path.read_text()
    assert report.render(text) == text, f"run python -m benchmarks.report ({path.name} is stale)"


def test_a_changed_figure_or_an_unknown_table_is_caught():
    rendered = report.render("intro\n<!-- table: scale -->\n<!-- /table -->\n")
    assert "| commit | pairs |" in rendered and "docs/results/scale-cpu.json" in rendered
    figure = rendered.split("\n")[4].split(" | ")[3]  # a cold-start time of the first row
    assert report.render(rendered.replace(figure, "1.0 s", 1)) == rendered
    with pytest.raises(KeyError, match="no renderer for table 'nonsense'"):
        report.render("<!-- table: nonsense -->\n<!-- /table -->\n")


def test_every_rendered_json_says_what_it_measured_where_and_how():
    for name in ("scale-cpu.json", "scale-cpu-36m.json", "bf16-cpu.json"):
        document = report.load(name)
        assert document["command"] and document["machine"]["hardware"] and document["machine"]["date"]
        commits = (
            [document["commit"]] if "commit" in document else [result["commit"] for result in document["results"]]
        )
        assert commits and all(len(commit) == 40 for commit in commits), name
