"""The benchmark compares like with like: the same function, the same tokens, and a memory figure that is real."""

import io
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest
import torch
from transformers import Seq2SeqTrainingArguments

from benchmarks.benchmark import Measurement, markdown_table
from benchmarks.synthetic import build_models, generation_runs, source_batch
from benchmarks.test_durations import ci_phases, durations
from benchmarks.training_step import MULTI30K, RECIPE, multi30k_pairs, trainer_for, update_steps
from hf_vanilla.text_files import stream_lines
from hf_vanilla.tokenization import train_bpe_tokenizer

from .conftest import REVERSAL_SOURCES


def test_both_models_generate_the_same_tokens():
    models = build_models("small", "cpu", torch.float32)
    for mixed, beams in ((False, 1), (True, 4)):
        runs = generation_runs(models, source_batch(4, 12, 8000, "cpu", mixed), 8, beams)
        assert torch.equal(runs["ours"](), runs["marian"]())


def test_both_trainers_make_the_same_updates_on_the_same_batches(tmp_path):
    """The training-step benchmark times the same computation: without dropout, our trainer (the model's chunked
    label-smoothed loss) and Marian's (the library's LabelSmoother over its logits) give the same loss at each of
    three updates, so the gradients, clipping and AdamW steps between them agree too."""
    tokenizer = train_bpe_tokenizer(islice(stream_lines(MULTI30K / "train.en.gz"), 2000), 400, show_progress=False)
    shape = dict(d_model=32, layers=2, heads=2, ffn=64, vocab=len(tokenizer), dropout=0.0)
    models = build_models(shape, "cpu", torch.float32)
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **RECIPE)
    dataset = multi30k_pairs(tokenizer, pairs=300)
    trainers = {name: trainer_for(model, tokenizer, dataset, args) for name, model in models.items()}
    batches = list(islice(trainers["ours"].get_train_dataloader(), 3))
    losses = {name: update_steps(trainer, batches)() for name, trainer in trainers.items()}
    assert losses["ours"] == pytest.approx(losses["marian"], rel=1e-5)
    assert losses["ours"][0] != losses["ours"][2]  # the updates changed the weights


def test_report_ratio_and_direction():
    row = Measurement("generation", "tokens/s", ours=[300.0, 310.0, 320.0], marian=[200.0, 200.0, 210.0]).row()
    assert row["ratio"] == 310.0 / 200.0 and row["better"] == "higher"
    table = markdown_table({"results": [row]})
    expected = "| generation | tokens/s | 310.00 [300.00–320.00] | 200.00 [200.00–210.00] | 1.55 (higher is better)"
    assert expected in table


def test_each_engine_that_ran_gets_its_column_and_ratio():
    engines = {"ctranslate2_float32": [250.0], "ctranslate2_int8": [400.0], "onnxruntime_float32": [150.0]}
    row = Measurement("greedy", "tokens/s", ours=[100.0], marian=[100.0], engines=engines).row()
    assert row["ctranslate2_int8"]["ratio_vs_marian"] == 4.0 and "ctranslate2_int8_float32" not in row
    training = Measurement("training", "tokens/s", ours=[10.0], marian=[10.0]).row()  # no engine trains
    header, _, greedy, trained = markdown_table({"results": [row, training]}).splitlines()
    ratio = "| ratio (ours/Marian) |"
    assert header.endswith(f"{ratio} CTranslate2 float32 | CTranslate2 int8 | ONNX Runtime float32 |")
    assert greedy.endswith("| 250.0 (2.50x Marian) | 400.0 (4.00x Marian) | 150.0 (1.50x Marian) |")
    assert trained.endswith("(higher is better) | — | — | — |")
    # Where no engine ran (the engines run on the CPU only: a GPU run), the table ends at the ratio.
    assert markdown_table({"results": [training]}).splitlines()[0].endswith(ratio)


# In a process of its own: in a worker that earlier tests ran in, the allocator may hand back pages it kept resident
# after they were freed, and the block then raises no peak.
SPIKE = """
import torch
from benchmarks.memory import peak_rss_increase

def spike():
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, written, then released before returning
    del block

print(peak_rss_increase(spike))
"""


def test_peak_memory_sees_a_block_that_is_already_freed():
    root = Path(__file__).resolve().parents[1]
    measured = subprocess.run([sys.executable, "-c", SPIKE], cwd=root, capture_output=True, text=True, timeout=120)
    assert measured.returncode == 0, measured.stderr[-2000:]
    assert 60 <= float(measured.stdout) <= 72


def test_durations_add_up_per_file_and_ci_phases_run_from_step_to_step(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite tests="3" skipped="1" failures="0" errors="0" time="5.0">'
        '<testcase classname="tests.test_a" name="one" time="1.5"/>'
        '<testcase classname="tests.test_a.TestGroup" name="two" time="2.0"/>'
        '<testcase classname="tests.test_b" name="three" time="0.25"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    result = durations(report)
    assert result["files"] == [
        {"file": "tests/test_a.py", "tests": 2, "seconds": 3.5},
        {"file": "tests/test_b.py", "tests": 1, "seconds": 0.2},
    ]
    assert result["wall_s"] == 5.0 and result["sum_of_tests_s"] == 3.8 and result["skipped"] == 1
    assert result["slowest"][0] == {"test": "tests.test_a.TestGroup::two", "seconds": 2.0}
    log = tmp_path / "ci.log"
    log.write_text("\n== Install (0 s into CI)\npip\n== Tests (130 s into CI)\n...\n== CI passed (400 s into CI)\n")
    assert ci_phases(log) == {
        "ci_s": 400,
        "phases": [{"phase": "Install", "seconds": 130}, {"phase": "Tests", "seconds": 270}],
    }
    log.write_text("== Install (0 s into CI)\n== Tests (130 s into CI)\n")
    with pytest.raises(SystemExit, match="not the log of a CI run that passed"):
        ci_phases(log)


def test_the_subword_nmt_bpe_makes_exactly_the_merges_asked_within_words(tmp_path):
    """By hand: the words ab (3 times), cd (2) and ca (1) start as a b</w>, c d</w> and c a</w>: 7 symbols (a, b, c,
    d and the word-final a</w>, b</w>, d</w>). Two merges are a + b</w> (3), then c + d</w> (2), never c + a</w>
    (seen once), and never across a space; a character never met is unknown. Saved and loaded, it decodes back."""
    from transformers import AutoTokenizer

    from benchmarks.subword_nmt_bpe import train_subword_nmt_bpe, word_symbols

    texts = ["ab ab ab cd", "cd ca"]
    assert word_symbols(texts) == ["a", "a</w>", "b", "b</w>", "c", "d", "d</w>"]
    train_subword_nmt_bpe(texts, merges=2).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == 4 + 7 + 2
    assert tokenizer.tokenize("ab cd ca a b cab abd") == [
        "ab</w>", "cd</w>", "c", "a</w>", "a</w>", "b</w>", "c", "ab</w>", "a", "b", "d</w>",
    ]  # fmt: skip
    assert tokenizer.tokenize("e") == ["<unk>"]
    ids = tokenizer("ab cd ca")["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id and tokenizer.decode(ids, skip_special_tokens=True) == "ab cd ca"


BPE_OF_3000_LINES = """
import sys
from benchmarks.subword_nmt_bpe import train_subword_nmt_bpe
from tests.test_benchmarking import first_tokenised_lines
train_subword_nmt_bpe(first_tokenised_lines("train", 3000), merges=600).save_pretrained(sys.argv[1])
"""


def first_tokenised_lines(split: str, count: int) -> list[str]:
    """The first `count` lines of each side of a split of the paper's tokenised Multi30k files."""
    from hf_vanilla.data import BUNDLED_CORPORA, find_split_file

    folder, pattern = BUNDLED_CORPORA["multi30k-tok"]
    return [
        line
        for side in ("en", "de")
        for line in islice(stream_lines(find_split_file(folder, split, side, pattern)), count)
    ]


def test_the_subword_nmt_bpe_is_the_same_from_one_process_to_the_next_and_segments_as_subword_nmt(tmp_path):
    """Two processes (each hashes with its own random seed) make the same files, and the tokenizer splits words as
    subword-nmt's own apply_bpe does with the same merges, on lines it did not learn from."""
    from subword_nmt.apply_bpe import BPE
    from transformers import AutoTokenizer

    from benchmarks.subword_nmt_bpe import learn_merges

    folders = [tmp_path / "first", tmp_path / "second"]
    for folder in folders:
        subprocess.run(
            [sys.executable, "-c", BPE_OF_3000_LINES, str(folder)], cwd=Path(__file__).parents[1], check=True
        )
    assert (folders[0] / "tokenizer.json").read_bytes() == (folders[1] / "tokenizer.json").read_bytes()

    merges = learn_merges(first_tokenised_lines("train", 3000), 600)
    codes = "#version: 0.2\n" + "".join(f"{left} {right}\n" for left, right in merges)
    reference = BPE(io.StringIO(codes), separator="@@")
    tokenizer = AutoTokenizer.from_pretrained(folders[0])
    for line in first_tokenised_lines("val", 200):
        pieces = reference.process_line(line).split()
        assert tokenizer.tokenize(line) == [p.removesuffix("@@") if p.endswith("@@") else p + "</w>" for p in pieces]


def test_a_search_arm_spelt_out_changes_recipe_options_and_the_recipes_own_model_preset(tmp_path):
    import json

    from benchmarks.budget_search import QUICKSTART, arm_changes, arm_options

    arm = "model.dropout=0.3,max_tokens=4096,model.encoder_layers=6"
    assert arm_changes(arm) == (["--max_tokens", "4096"], {"dropout": 0.3, "encoder_layers": 6})
    options = arm_options(arm, QUICKSTART, tmp_path)
    assert options[:3] == ["--max_tokens", "4096", "--model_config"]
    preset = json.loads(Path(options[3]).read_text())
    assert (preset["dropout"], preset["encoder_layers"], preset["d_model"]) == (0.3, 6, 128)  # the rest: the recipe's
    with pytest.raises(ValueError, match="'dropout' is not key=value"):
        arm_changes("dropout")


def test_a_results_document_records_a_command_that_runs_again_as_written(monkeypatch):
    """Arguments with spaces, quotes or JSON come back from the recorded command as they were given."""
    import shlex

    from benchmarks import record

    arguments = ["--arms", 'lr_scheduler_kwargs={"decay_share":0.35}', "--run", "xdist's order", "90b8f9a"]
    monkeypatch.setattr(sys, "argv", ["budget_search.py", *arguments])
    command = record("benchmarks.budget_search", [])["command"]
    assert shlex.split(command) == ["python", "-m", "benchmarks.budget_search", *arguments]


def test_the_decoding_search_scores_a_runs_last_weights_with_each_setting(reversal_model, tmp_path):
    """A model that reverses every source scores 100 with every setting; a run without averaged weights has no such
    column; a setting is beam:length_penalty."""
    from tokenizers import pre_tokenizers

    from benchmarks.decode_search import search_run, setting, table

    model, tokenizer = reversal_model
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # reads "t5 t9 </s>" as 3 tokens
    model.save_pretrained(tmp_path / "checkpoint-2")
    tokenizer.save_pretrained(tmp_path / "final")
    sources = [" ".join(f"t{i}" for i in ids) + " </s>" for ids in REVERSAL_SOURCES[:8]]
    references = [" ".join(f"t{i}" for i in reversed(ids)) for ids in REVERSAL_SOURCES[:8]]
    run = search_run(1, tmp_path, [(1, 1.0), (4, 2.0)], sources, references, "none")
    assert [(entry["weights"], entry["beam"], entry["length_penalty"]) for entry in run["scores"]] == [
        ("last", 1, 1.0),
        ("last", 4, 2.0),
    ]
    assert [entry["bleu"] for entry in run["scores"]] == pytest.approx([100.0, 100.0])
    assert "tok:none" in run["bleu_signature"]
    assert "| 4 | 2 | 100.00 | 100.00 |" in table({"results": [run]})
    assert setting("5:0.6") == (5, 0.6)
    with pytest.raises(Exception, match="expected beam:length_penalty"):
        setting("5")


def test_a_search_run_cut_short_resumes_from_its_last_checkpoint_and_a_new_one_starts_afresh(tmp_path):
    from benchmarks.budget_search import QUICKSTART, train_command
    from hf_vanilla.training.arguments import parse_arguments, resume_point

    output = tmp_path / "arm-5750-seed1"
    output.mkdir()
    command = train_command("learning_rate=0.003", 1, (None, 5750), output, QUICKSTART, ["--max_tokens", "2048"])
    assert command[1:4] == ["-m", "hf_vanilla", "train"] and "--resume_from_checkpoint" not in command
    (output / "checkpoint-3250").mkdir()
    resumed = train_command("learning_rate=0.003", 1, (None, 5750), output, QUICKSTART, ["--max_tokens", "2048"])
    assert resumed[: len(command) - 2] == command[:-2]  # the same run, continued
    # as the train command reads it: the same budget, seed and arm, into the same folder, from the last checkpoint
    recipe, training = parse_arguments(resumed[4:])
    assert (training.max_steps, training.seed, training.learning_rate) == (5750, 1, 0.003)
    assert (recipe.max_tokens, training.output_dir) == (2048, str(output))
    assert resume_point(training.resume_from_checkpoint) is True  # the newest checkpoint in the output folder


def test_the_published_record_counts_the_training_of_every_session_of_a_resumed_run(tmp_path):
    """A run stopped and resumed: its scores carry the last session's training time, its clock the whole run's."""
    import json

    from transformers import TrainerState

    from benchmarks.published_record import describe_run

    log = ["step,epoch,name,value"]
    for step, epoch, loss in ((58, 1.0, 3.0), (90, 1.55, 2.9), (116, 2.0, 2.5), (174, 3.0, 2.6)):
        log += [f"{step},{epoch},eval_loss,{loss}", f"{step},{epoch},eval_bleu,{30 + loss}"]
    (tmp_path / "log.csv").write_text("\n".join(log) + "\n")
    checkpoint = tmp_path / "checkpoint-174"
    checkpoint.mkdir()
    clock = {"TrainState": {"args": {}, "attributes": {"train_seconds": 3600.0, "progress": 1.0}}}
    TrainerState(global_step=174, stateful_callbacks=clock).save_to_json(str(checkpoint / "trainer_state.json"))
    scores = {"global_step": 174, "train_wall_seconds": 600.0, "hardware": "CPU X; 1 process(es)"}
    scores |= {"test_bleu": 40.0, "test_chrf": 60.0, "bleu_signature": "tok:none", "final_weights": "averaged"}
    (tmp_path / "test_scores.json").write_text(json.dumps(scores))

    run = describe_run(1, tmp_path)
    assert run["train_seconds"] == 3600.0 and run["updates"] == 174 and run["ended"]
    # patience counts the epochs' ends, not the mid-epoch evaluation at update 90
    assert (run["lowest_loss_epoch"], run["epochs_since_lowest_loss"]) == (2.0, 1)


def test_a_recipes_budget_is_its_configs_unless_its_options_change_it_as_a_command_line_would(tmp_path):
    from benchmarks.recipe_pace import max_steps_of

    config = tmp_path / "recipe.yaml"
    config.write_text("max_steps: 6000\nseed: 1\n")
    assert max_steps_of(str(config), ["--seed", "2"]) == 6000  # the config's
    assert max_steps_of(str(config), ["--max_steps", "6800", "--seed", "2"]) == 6800
    assert max_steps_of(str(config), ["--max_steps", "900", "--max_steps", "700"]) == 700  # the last, as argparse


def test_a_recipes_pace_carries_to_the_reference_machine_as_a_share_of_the_main_jobs():
    from benchmarks.recipe_pace import table

    main_job = {"recipe": "main", "config": "configs/quickstart.yaml", "options": "--dropout_min_epochs 1000"}
    hour = {"recipe": "hour", "config": "configs/multi30k_record.yaml", "options": ""}
    document = {"results": [{**main_job, "max_steps": 3000, "updates_per_minute": 165.0},
                            {**hour, "max_steps": 6000, "updates_per_minute": 132.0}]}  # fmt: skip
    rows = table(document).splitlines()[2:]
    # 132 / 165 = 0.8 of the main job's pace; 6000 updates at 0.8 x 125 a minute take 60 minutes
    assert rows[1] == "| hour | `configs/multi30k_record.yaml` | 132.0 | 0.80 | 6000 in 60 min |"
    assert rows[0] == "| main | `configs/quickstart.yaml --dropout_min_epochs 1000` | 165.0 | 1.00 | the yardstick |"
