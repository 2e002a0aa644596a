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
    assert "| commit | corpus | pairs |" in rendered and "docs/results/scale-cpu.json" in rendered
    figure = rendered.split("\n")[4].split(" | ")[3]  # a cold-start time of the first row
    assert report.render(rendered.replace(figure, "1.0 s", 1)) == rendered
    with pytest.raises(KeyError, match="no renderer for table 'nonsense'"):
        report.render("<!-- table: nonsense -->\n<!-- /table -->\n")


def test_every_json_in_docs_results_says_what_it_measured_where_and_how():
    names = sorted(path.name for path in report.RESULTS.glob("*.json"))
    assert names
    for name in names:
        document = report.load(name)
        assert document["command"].startswith("python -m benchmarks."), name
        assert document["machine"]["hardware"] and document["machine"]["date"], name
        commits = (
            [document["commit"]] if "commit" in document else [result["commit"] for result in document["results"]]
        )
        assert commits and all(len(commit) == 40 for commit in commits), name


def test_every_json_in_docs_results_is_rendered_into_the_docs():
    """A result nobody reads is stale or superseded: it belongs in docs/results/archive/."""
    rendered = "".join(report.render(path.read_text()) for path in report.DOCUMENTS)
    unread = [path.name for path in report.RESULTS.glob("*.json") if f"docs/results/{path.name}" not in rendered]
    assert not unread, unread


def test_the_published_record_sits_beside_every_seed_that_ended_and_each_budget_of_the_main_job():
    from benchmarks.published_record import beside_ours

    signature = "nrefs:1|tok:none"
    seed = {
        "ended": True,
        "trained_on": "CPU X; 1 process(es)",
        "train_seconds": 600,
        "test": {"bleu_signature": signature},
    }
    record = {
        "results": [
            {**seed, "seed": 1, "updates": 40, "test": {**seed["test"], "test_bleu": 40.0}},
            {**seed, "seed": 2, "updates": 50, "test": {**seed["test"], "test_bleu": 41.0}},
            {**seed, "seed": 3, "updates": 9, "ended": False, "test": {**seed["test"], "test_bleu": 1.0}},
        ]
    }
    job = {"bf16": False, "minutes": 10, "train_wall_s": 600, "bleu_signature": "tok:13a", "test": {"test_bleu": 35.0}}
    main_job = {"machine": {"hardware": "CPU Y; 1 process(es)"}, "results": [{**job, "seed": 1, "updates": 1250}]}
    hour = {"config": "configs/multi30k_record.yaml", "results": [{**seed, "seed": 7, "updates": 60}]}
    hour["results"][0]["test"] = {**seed["test"], "test_bleu": 42.0}
    lines = beside_ours([record, hour], main_job).splitlines()
    assert lines[2].startswith("| Wu et al. 2021") and "**41.02**" in lines[2]
    assert lines[3] == (
        "| their recipe as published, here | 1 / 2 | 40 / 50 | 10 / 10 | CPU X | 40.00 / 41.00 | **40.50** | "
        "`nrefs:1\\|tok:none` |"
    )  # the run that has not ended is left out; a | of the signature cannot end the cell
    assert lines[4] == "| our hour recipe, here | 7 | 60 | 10 | CPU X | 42.00 | **42.00** | `nrefs:1\\|tok:none` |"
    assert lines[5] == "| the main job, 10 minutes | 1 | 1250 | 10 | CPU Y | 35.00 | **35.00** | `tok:13a` |"
    assert len(lines) == 6


def test_the_hour_records_rows_say_which_weights_the_validation_split_kept():
    from benchmarks.published_record import hour_table

    scores = {"test_bleu": 41.5, "final_weights": "last", "validation_bleu_last": 40.7}
    scores["validation_bleu_averaged"] = 40.1
    ended = {"seed": 1, "updates": 6000, "trained_on": "CPU X; 1 process(es)", "train_seconds": 3600, "test": scores}
    going = {"seed": 2, "updates": 250, "trained_on": "CPU X; 1 process(es)", "train_seconds": None}
    rows = hour_table({"commit": "b" * 40, "results": [{"commit": "a" * 40} | ended, going]}).splitlines()[2:]
    # a seed kept from an earlier record names its own commit; the others, the record's
    assert rows[0] == "| 1 | 6000 | CPU X | 60 | 40.70 | 40.10 | last | 41.50 | aaaaaaa |"
    assert rows[1] == "| 2 | 250 | CPU X | - | - | - | - | not ended | bbbbbbb |"


def test_a_record_keeps_the_earlier_seeds_that_were_not_run_again_with_their_commit():
    from benchmarks.published_record import kept_runs

    earlier = {"config": "configs/multi30k_record.yaml", "commit": "c1", "results": [{"seed": 1}, {"seed": 2}]}
    assert kept_runs(earlier, "configs/multi30k_record.yaml", {2, 3}) == [{"seed": 1, "commit": "c1"}]
    # a run kept twice keeps the commit it ran at, not the one of the record that kept it
    earlier["results"][0]["commit"] = "c0"
    assert kept_runs(earlier, "configs/multi30k_record.yaml", {3})[0]["commit"] == "c0"
    with pytest.raises(ValueError, match="that record is of configs/multi30k_record.yaml"):
        kept_runs(earlier, "configs/multi30k_wu2021.yaml", {3})
