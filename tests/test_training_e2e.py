"""Whole runs: the CI smoke recipe end to end, two processes under accelerate, the WMT14 recipe on a look-alike
(kills and resumes: test_training_kills.py)."""

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, pipeline
from transformers.trainer_pt_utils import LabelSmoother

from hf_vanilla.data import load_parallel_corpus
from hf_vanilla.pipeline_vanilla import decoding_max_length
from hf_vanilla.training import TokenBudgetBatchSampler

from .conftest import REMOTE_PIPELINE, free_port, run_without_hf_vanilla
from .test_example_scripts import OFFLINE_SACREBLEU, RUN_TRANSLATION, write_json_lines


ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "workers" / "train_worker.py"
# The CI recipe through the command users run.
SMOKE_COMMAND = [sys.executable, "-m", "hf_vanilla", "train", "--config", "configs/smoke.yaml"]
# The worker imports `benchmarks.synthetic` from the repository root, which is not installed.
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def run(command: list[str], cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    return result


@pytest.fixture(scope="module")
def smoke_run_once(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The CI recipe run once by the command, with a data cache of its own (so the BPE and tokenizing run)."""
    work = tmp_path_factory.mktemp("smoke")
    output = work / "run"
    command = [*SMOKE_COMMAND, "--output_dir", str(output)]
    return output, run([*command, "--data_cache_dir", str(work / "data_cache")])


@pytest.fixture
def smoke_run(smoke_run_once, own) -> tuple[Path, subprocess.CompletedProcess]:
    return own(smoke_run_once)


@pytest.mark.slow
def test_smoke_recipe_tokenizer_train_evaluate_average_save_reload_translate(smoke_run, tmp_path):
    output, result = smoke_run
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a" in result.stdout
    assert "pin_memory" not in result.stderr  # PyTorch's warning when memory is pinned without a GPU

    scores = json.loads((output / "test_scores.json").read_text())
    assert scores["global_step"] == 40 and scores["dropped_training_pairs"] == 0
    assert scores["seed"] == 1 and scores["train_wall_seconds"] > 0 and "torch " in scores["hardware"]
    # The scores file agrees with sacreBLEU run here on the written translations and the raw references.
    hypotheses = (output / "test_translations.txt").read_text(encoding="utf-8").splitlines()
    references = load_parallel_corpus("multi30k", "en", "de", splits=("test",))["test"]["target"][:40]
    assert len(hypotheses) == 40
    recomputed = sacrebleu.corpus_bleu(hypotheses, [references])
    assert scores["bleu_raw_references"] == pytest.approx(recomputed.score, abs=1e-9)
    assert scores["bleu_signature"].endswith(f"version:{sacrebleu.__version__}")
    assert (output / "tokenizer" / "tokenizer.json").exists()  # trained because none was given
    assert (output / "averaged" / "model.safetensors").exists() and (output / "averaged" / "tokenizer.json").exists()
    assert (output / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert list((output / "runs").rglob("events.out.tfevents.*")), "TensorBoard logs"
    log = (output / "log.csv").read_text().splitlines()
    assert log[0] == "step,epoch,name,value" and any(",eval_bleu," in row for row in log)
    assert any(",eval_source_use," in row for row in log)  # the neglect detector is on by default
    losses = [float(row.split(",")[3]) for row in log[1:] if row.split(",")[2] == "loss"]
    assert losses[-1] < losses[0]  # it learns
    # The final weights are the better of the averaged and the last by validation BLEU (a tie keeps the average),
    # both scores logged; final/ holds exactly the chosen ones.
    validation = {name: scores[f"validation_bleu_{name}"] for name in ("averaged", "last")}
    chosen = "averaged" if validation["averaged"] >= validation["last"] else "last"
    assert scores["final_weights"] == chosen
    assert any(f",final_{chosen}_bleu,{validation[chosen]}" in row for row in log)
    final = load_file(output / "final" / "model.safetensors")
    source = load_file(output / ("averaged" if chosen == "averaged" else "checkpoint-40") / "model.safetensors")
    assert final.keys() == source.keys() and all(torch.equal(final[key], source[key]) for key in final)
    assert not (output / "final" / "hyperparameters.json").exists()  # the model's folder holds the model alone
    hyperparameters = json.loads((output / "hyperparameters.json").read_text())
    assert hyperparameters["checkpoints_averaged"] == (2 if chosen == "averaged" else 0)
    assert hyperparameters["label_smoothing"] == 0.1
    for folder in ("final", "averaged", "checkpoint-40"):  # our length limit, not the library's 20 leaked in
        assert json.loads((output / folder / "generation_config.json").read_text())["max_length"] == 512

    assert not list((output / "final").glob("*.bin")), "final/ holds the model, not the Trainer's training_args.bin"

    # A Trainer checkpoint translates in a Python without hf_vanilla, through remote code only, as the package does.
    sources = ["A dog.", "Two men sit on a bench."]
    stdout = run_without_hf_vanilla(REMOTE_PIPELINE, [str(output / "checkpoint-40"), json.dumps(sources)], tmp_path)
    checkpoint = AutoModelForSeq2SeqLM.from_pretrained(output / "checkpoint-40", attn_implementation="eager")
    translator = pipeline("translation", model=checkpoint, tokenizer=AutoTokenizer.from_pretrained(output / "final"))
    expected = translator(sources, num_beams=1, max_new_tokens=15, batch_size=2)
    assert json.loads(stdout.strip().splitlines()[-1]) == [o["translation_text"] for o in expected]

    # The pipeline gives what generate() and the tokenizer give by hand.
    model = AutoModelForSeq2SeqLM.from_pretrained(output / "final")
    tokenizer = AutoTokenizer.from_pretrained(output / "final")
    translation = pipeline("translation", model=model, tokenizer=tokenizer)("A dog runs.", num_beams=2)
    tokens = model.generate(**tokenizer(["A dog runs."], return_tensors="pt").to(model.device), num_beams=2)
    assert translation[0]["translation_text"] == tokenizer.decode(tokens[0], skip_special_tokens=True)


@pytest.mark.slow
def test_a_run_in_the_folder_of_an_averaged_run_never_ships_that_average(smoke_run):
    """The smoke run averaged its last 2 checkpoints; another run in the same folder, averaging none and with another
    seed, keeps its own last weights, and the earlier average is gone rather than left beside them."""
    output, _ = smoke_run
    assert (output / "averaged").is_dir()
    result = run([*SMOKE_COMMAND, "--output_dir", str(output), "--average_last", "0", "--seed", "7"])
    scores = json.loads((output / "test_scores.json").read_text())
    assert scores["final_weights"] == "last" and scores["seed"] == 7
    assert not (output / "averaged").exists() and "an earlier run's average" in result.stderr


@pytest.mark.slow
def test_a_run_choosing_its_final_weights_as_the_test_decodes_scores_them_with_the_tests_beam_search(tmp_path):
    """`--final_choice_decoding test`: the validation scores that choose between the last and the averaged weights
    are those of the validation split translated with the test's beam and length penalty, recomputed here by
    generate() on each saved model, in one batch as the run's evaluation translates it. Its chrF tells the searches
    apart where this short run's BLEU is near 0: greedy search scores another."""
    output = tmp_path / "run"
    test_decoding = ["--test_num_beams", "3", "--test_length_penalty", "2.0", "--final_choice_decoding", "test"]
    shorter = ["--max_steps", "20", "--eval_strategy", "no", "--save_steps", "10"]
    run([*SMOKE_COMMAND, "--output_dir", str(output), *shorter, *test_decoding])
    scores = json.loads((output / "test_scores.json").read_text())
    logged = {row["name"]: float(row["value"]) for row in csv.DictReader((output / "log.csv").open())}
    corpus = load_parallel_corpus("multi30k", "en", "de", splits=("validation", "test"))
    sources, references = corpus["validation"]["source"][:40], corpus["validation"]["target"][:40]
    tokenizer = AutoTokenizer.from_pretrained(output / "final")
    labels = tokenizer(text_target=references)["input_ids"]
    references = tokenizer.batch_decode(labels, skip_special_tokens=True)  # as the run's labels decode
    inputs = tokenizer(sources, return_tensors="pt", padding=True)
    # the run's generation budget: its longest validation or test source, plus 50 target tokens
    longest = max(len(ids) for ids in tokenizer([*sources, *corpus["test"]["source"][:40]])["input_ids"])
    for weights, folder in {"last": output / "checkpoint-20", "averaged": output / "averaged"}.items():
        model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()

        def translate(**decoding) -> list[str]:
            with torch.no_grad():
                generated = model.generate(**inputs, max_length=decoding_max_length(longest), **decoding)
            return tokenizer.batch_decode(generated, skip_special_tokens=True)

        beam = translate(num_beams=3, length_penalty=2.0)
        assert scores[f"validation_bleu_{weights}"] == pytest.approx(sacrebleu.corpus_bleu(beam, [references]).score)
        assert logged[f"final_{weights}_chrf"] == pytest.approx(sacrebleu.corpus_chrf(beam, [references]).score)
        greedy = sacrebleu.corpus_chrf(translate(num_beams=1), [references]).score
        assert greedy != pytest.approx(logged[f"final_{weights}_chrf"])


@pytest.mark.slow
def test_a_run_evaluating_without_generation_scores_loss_chooses_by_loss_and_still_translates_the_test(tmp_path):
    """`--predict_with_generate false`, as fairseq validates (the loss alone): every evaluation logs a loss and no
    BLEU, the final choice between the averaged and the last weights goes by validation loss (lower wins, a tie keeps
    the average), and the test split is still translated with beam search and scored."""
    output = tmp_path / "run"
    no_generation = [
        "--predict_with_generate",
        "false",
        "--metric_for_best_model",
        "loss",
        "--greater_is_better",
        "false",
    ]
    run([*SMOKE_COMMAND, "--output_dir", str(output), "--max_steps", "20", "--eval_steps", "10", *no_generation])
    names = {row["name"] for row in csv.DictReader((output / "log.csv").open())}
    assert "eval_loss" in names and not any(name.endswith("_bleu") and name != "test_bleu" for name in names)
    scores = json.loads((output / "test_scores.json").read_text())
    validation = {name: scores[f"validation_loss_{name}"] for name in ("averaged", "last")}
    assert scores["final_weights"] == ("averaged" if validation["averaged"] <= validation["last"] else "last")
    hypotheses = (output / "test_translations.txt").read_text(encoding="utf-8").splitlines()
    references = load_parallel_corpus("multi30k", "en", "de", splits=("test",))["test"]["target"][:40]
    assert scores["bleu_raw_references"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert "test_bleu" in scores and len(hypotheses) == 40


@pytest.mark.slow
def test_lr_scale_gives_the_papers_learning_rate_at_every_step(tmp_path):
    """§5.3, lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), against the rate the command's Trainer
    logged for each update. transformers' schedule, like fairseq's, gives update n the formula's rate at n - 1 (the
    first update runs at 0): one update behind the paper, which numbers its steps from 1."""

    def paper(step: int) -> float:
        return 0.0 if step == 0 else scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)

    scale, warmup, steps, d_model = 2.0, 8, 14, json.loads((ROOT / "configs" / "tiny.json").read_text())["d_model"]
    options = ["--lr_scale", str(scale), "--warmup_steps", str(warmup), "--max_steps", str(steps)]
    options += ["--logging_steps", "1", "--eval_strategy", "no", "--save_strategy", "no", "--average_last", "0"]
    options += ["--max_test_examples", "4", "--report_to", "none", "--output_dir", str(tmp_path / "run")]
    run([*SMOKE_COMMAND, *options, "--data_cache_dir", str(tmp_path / "data_cache")])
    with (tmp_path / "run" / "log.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row["name"] == "learning_rate"]
    logged = {int(row["step"]): float(row["value"]) for row in rows}
    assert sorted(logged) == list(range(1, steps + 1))
    for update, rate in logged.items():
        assert rate == pytest.approx(paper(update - 1), rel=1e-6, abs=1e-12), update
    assert max(logged.values()) == pytest.approx(paper(warmup), rel=1e-6)  # the peak `--lr_scale` sets


TRAINING_SETTINGS = ("label_smoothing", "loss_chunk_size", "label_smoothing_factor", "learning_rate", "max_tokens")


@pytest.mark.slow
def test_a_trained_model_keeps_transformers_loss_contract_when_reloaded(smoke_run):
    output, _ = smoke_run
    for folder in ("final", "averaged", "checkpoint-40"):
        config = json.loads((output / folder / "config.json").read_text())
        assert not set(TRAINING_SETTINGS) & set(config), folder
    model = AutoModelForSeq2SeqLM.from_pretrained(output / "final").train()
    tokenizer = AutoTokenizer.from_pretrained(output / "final")
    batch = tokenizer(["A dog runs.", "Two men sit on a bench."], text_target=["Ein Hund.", "Zwei Männer."])
    batch = tokenizer.pad(batch, return_tensors="pt")
    labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    torch.manual_seed(0)  # the same dropout masks for both passes
    outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels)
    torch.manual_seed(0)
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels),
    ).logits
    assert outputs.logits is not None  # in training mode too
    plain = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert torch.allclose(outputs.loss, plain, atol=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(not RUN_TRANSLATION.exists(), reason="upstream run_translation.py is not beside the checkout")
@pytest.mark.parametrize("smoothing", [None, 0.1])
def test_run_translation_fine_tunes_a_trained_model_with_the_loss_it_asks_for(smoke_run, tmp_path, smoothing):
    """transformers' script, unmodified, fine-tunes the model our command trained: its evaluation loss is the
    library's `LabelSmoother` with `--label_smoothing_factor` and the plain cross entropy without, recomputed here on
    the fine-tuned weights."""
    output, _ = smoke_run
    for split, count in (("train", 32), ("val", 12)):
        write_json_lines(tmp_path / f"{split}.json", split, count)
    (tmp_path / "sacrebleu").mkdir()  # the script loads the metric even when it does not generate
    (tmp_path / "sacrebleu" / "sacrebleu.py").write_text(OFFLINE_SACREBLEU)
    finetuned = tmp_path / "finetuned"
    command = [
        sys.executable, str(RUN_TRANSLATION), "--model_name_or_path", str(output / "final"),
        "--source_lang", "en", "--target_lang", "de", "--train_file", "train.json", "--validation_file", "val.json",
        "--trust_remote_code", "--do_train", "--do_eval", "--max_steps", "2", "--per_device_train_batch_size", "8",
        "--per_device_eval_batch_size", "12", "--output_dir", str(finetuned), "--report_to", "none", "--use_cpu",
        "--save_strategy", "no",
    ]  # fmt: skip
    if smoothing is not None:
        command += ["--label_smoothing_factor", str(smoothing)]
    env = {**ENV, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert not set(TRAINING_SETTINGS) & set(json.loads((finetuned / "config.json").read_text()))

    model = AutoModelForSeq2SeqLM.from_pretrained(finetuned).eval()
    tokenizer = AutoTokenizer.from_pretrained(finetuned)
    rows = [json.loads(line)["translation"] for line in (tmp_path / "val.json").read_text().splitlines()]
    batch = tokenizer([row["en"] for row in rows], text_target=[row["de"] for row in rows])
    features = [{name: batch[name][row] for name in batch} for row in range(len(rows))]
    batch = DataCollatorForSeq2Seq(tokenizer, model=model)(features)
    with torch.no_grad():
        outputs = model(**batch)
    expected = LabelSmoother(epsilon=smoothing)(outputs, batch["labels"]) if smoothing else outputs.loss
    evaluation = json.loads((finetuned / "eval_results.json").read_text())
    assert evaluation["eval_loss"] == pytest.approx(expected.item(), abs=1e-4)


def launch_two_processes(output: Path, *worker_args: str) -> list[dict]:
    run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            "configs/accelerate_cpu.yaml",
            "--main_process_port",
            str(free_port()),
            str(WORKER),
            str(output),
            *worker_args,
        ]
    )
    return [json.loads((output / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="module")
def three_epochs_on_two_processes_once(tmp_path_factory) -> list[dict]:
    """The worker under `accelerate launch`, 2 processes of 2 micro-batches an update, 3 whole epochs: each rank's
    record. Read-only: every test that reads it takes `three_epochs_on_two_processes`, its own copy."""
    return launch_two_processes(tmp_path_factory.mktemp("whole"), "--epochs", "3", "--save-steps", "1000")


@pytest.fixture
def three_epochs_on_two_processes(three_epochs_on_two_processes_once, own) -> list[dict]:
    return own(three_epochs_on_two_processes_once)


def epochs_of(batches: list, epochs: int) -> list[list]:
    """A rank's recorded batches cut into its `epochs` epochs (every epoch has as many)."""
    per_epoch, left = divmod(len(batches), epochs)
    assert per_epoch and not left, (len(batches), epochs)
    return [batches[e * per_epoch : (e + 1) * per_epoch] for e in range(epochs)]


@pytest.mark.slow
def test_two_cpu_processes_see_different_batches_and_end_identical(three_epochs_on_two_processes):
    first, second = three_epochs_on_two_processes
    assert first["step"] == second["step"] > 0
    # No batch repeats within an epoch: one that both ranks hold there was trained twice.
    batches = [{tuple(map(tuple, batch)) for batch in epochs_of(rank["batches"], 3)[0]} for rank in (first, second)]
    assert len(batches[0]) >= 12 and len(batches[1]) >= 12
    assert not batches[0] & batches[1], "ranks must train on different data"
    assert first["weights"] == second["weights"], "DDP keeps the replicas identical"


@pytest.mark.slow
def test_two_processes_train_as_one_process_accumulating_the_same_micro_batches(tmp_path):
    """DDP over 2 processes (2 micro-batches each per update) against 1 process accumulating the same 4 micro-batches
    per update, dropout off: the Trainer counts label tokens across processes (average_tokens_across_devices), so both
    take the same gradient, up to the order of float sums (gloo's all-reduce), hence a tolerance, not equality."""
    first, second = launch_two_processes(tmp_path / "two", "--max-steps", "6", "--dropout", "0", "--save-weights")
    updates = [first["batches"][2 * u : 2 * u + 2] + second["batches"][2 * u : 2 * u + 2] for u in range(6)]

    def one_process(name: str, batches: list, accumulation: int) -> dict[str, torch.Tensor]:
        (tmp_path / f"{name}.json").write_text(json.dumps(batches))
        options = ["--max-steps", "6", "--dropout", "0", "--save-weights", "--replay", str(tmp_path / f"{name}.json")]
        run(
            [sys.executable, str(WORKER), str(tmp_path / name), *options, "--gradient-accumulation", str(accumulation)]
        )
        return load_file(tmp_path / name / "rank0.safetensors")

    together = load_file(tmp_path / "two" / "rank0.safetensors")
    alone = one_process("one", [batch for update in updates for batch in update], accumulation=4)
    half = one_process("half", [batch for update in updates for batch in update[:2]], accumulation=2)  # rank 0's only
    # Key biases are left out: adding b to every key adds q.b to all of a query's scores, which softmax ignores, so
    # their gradient is 0 in exact arithmetic; what float rounding leaves there, Adam (eps 1e-9) scales up to full
    # steps, differently in each run (measured: up to 2e-3 apart, every other weight within 2e-7).
    compared = [name for name in together if not name.endswith("k_proj.bias")]
    difference = max((alone[name] - together[name]).abs().max().item() for name in compared)
    assert difference < 1e-5, difference
    assert max((half[name] - together[name]).abs().max().item() for name in compared) > 100 * difference


@pytest.mark.slow
def test_two_cpu_processes_see_every_pair_of_an_epoch_once(three_epochs_on_two_processes):
    first, second = three_epochs_on_two_processes
    assert len(first["batches"]) == len(second["batches"]), "the ranks made the same number of steps"
    dataset = sorted(tuple(row) for row in first["dataset"])
    for epoch, batches in enumerate(zip(epochs_of(first["batches"], 3), epochs_of(second["batches"], 3), strict=True)):
        seen = [tuple(row) for rank in batches for batch in rank for row in batch]
        assert sorted(seen) == dataset, f"epoch {epoch}: no pair twice, none lost"


@pytest.mark.slow
def test_two_processes_reshuffle_every_epoch_and_resume_mid_epoch_in_its_order(
    three_epochs_on_two_processes, tmp_path
):
    """Under `accelerate launch`, 3 epochs: every epoch is the sampler's own order for that epoch (what one process
    visits), dealt to the ranks in turn; then a SIGTERM in the middle of epoch 2 and a resume, which must continue
    that epoch's order (Accelerate wraps the sampler once to shard it and once more to skip the trained batches)."""
    first, second = three_epochs_on_two_processes
    dataset = [tuple(ids) for ids in first["dataset"]]
    lengths = np.asarray([len(ids) for ids in dataset])  # the synthetic pairs' sides are equally long
    # the worker's settings: 2 processes, 2 micro-batches accumulated an update
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=48, seed=5, batches_per_update=4)
    ranks = [epochs_of(rank["batches"], 3) for rank in (first, second)]
    for epoch in range(3):
        sampler.set_epoch(epoch)
        expected = [[dataset[row] for row in batch] for batch in sampler]
        dealt = [batch for pair in zip(ranks[0][epoch], ranks[1][epoch], strict=True) for batch in pair]
        assert [[tuple(ids) for ids in batch] for batch in dealt] == expected, f"epoch {epoch}"
    assert ranks[0][0] != ranks[0][1] != ranks[0][2] != ranks[0][0]

    per_epoch = len(ranks[0][0])
    updates_per_epoch = -(-per_epoch // 2)  # 2 micro-batches accumulated per update
    stop = updates_per_epoch + updates_per_epoch // 2
    launch_two_processes(tmp_path / "resumed", "--epochs", "3", "--save-steps", "1000", "--terminate-at", str(stop))
    resumed = launch_two_processes(tmp_path / "resumed", "--epochs", "3", "--save-steps", "1000", "--resume")
    trained = per_epoch + 2 * (stop - updates_per_epoch)  # micro-batches of each rank before the stop
    for rank, whole in enumerate((first, second)):
        assert resumed[rank]["batches"] == whole["batches"][trained:], f"rank {rank} after the resume"
    assert resumed[0]["weights"] == resumed[1]["weights"] == first["weights"], "the resume ends where the run did"


@pytest.mark.slow
def test_two_processes_tokenize_once_and_test_every_sentence_once(tmp_path):
    cache = tmp_path / "cache"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "configs/accelerate_cpu.yaml"]
    command += ["--main_process_port", str(free_port())]
    command += ["-m", "hf_vanilla", "train", "--config", "configs/smoke.yaml", "--output_dir", str(tmp_path / "run")]
    command += ["--data_cache_dir", str(cache), "--max_steps", "2", "--eval_steps", "2", "--save_steps", "2"]
    command += ["--average_last", "0", "--use_cpu", "true", "--report_to", "none"]
    command += ["--max_test_examples", "9", "--per_device_eval_batch_size", "4"]  # 2 x 4 does not divide 9
    log = run(command).stderr
    assert re.search(r"\[rank 0\] startup: tokenizing \(built ", log), log[-3000:]
    assert re.search(r"\[rank 1\] startup: tokenizing \(opened ", log), log[-3000:]
    assert len(list((cache / "tokenized").iterdir())) == 1 and len(list((cache / "tokenizers").iterdir())) == 1
    assert log.count("Trained a 600-entry BPE") == 1
    # Accelerate repeats test sentences to fill the last batch of every process; each is scored once.
    assert len((tmp_path / "run" / "test_translations.txt").read_text().splitlines()) == 9


@pytest.mark.slow
def test_the_wmt14_recipe_runs_end_to_end_on_a_local_wmt14_look_alike(tmp_path):
    from hf_vanilla.text_files import stream_lines

    from .conftest import MULTI30K
    from .test_data import make_wmt14_like

    english, german = list(stream_lines(MULTI30K / "train.en.gz")), list(stream_lines(MULTI30K / "train.de.gz"))
    pairs = {"train": list(zip(english[:300], german[:300], strict=True))}
    pairs["validation"], pairs["test"] = pairs["train"][:6], pairs["train"][6:14]
    make_wmt14_like(tmp_path / "wmt14", pairs)
    tiny = tmp_path / "tiny.json"
    tiny.write_text(
        json.dumps(
            {
                "model_type": "vanilla_transformer",
                "d_model": 32,
                "encoder_layers": 1,
                "decoder_layers": 1,
                "encoder_attention_heads": 2,
                "decoder_attention_heads": 2,
                "encoder_ffn_dim": 64,
                "decoder_ffn_dim": 64,
            }
        )
    )
    output = tmp_path / "run"
    command = [sys.executable, "-m", "hf_vanilla", "train", "--config", "configs/wmt14_en_de_base.yaml"]
    command += [
        "--data",
        str(tmp_path / "wmt14"),
        "--output_dir",
        str(output),
        "--data_cache_dir",
        str(tmp_path / "c"),
    ]
    # the recipe as written, made small enough for a CPU test: the model, the vocabulary, the number of updates
    command += ["--model_config", str(tiny), "--vocab_size", "400", "--max_tokens", "512", "--max_steps", "2"]
    command += ["--save_steps", "1", "--eval_steps", "2", "--average_last", "2", "--dataloader_num_workers", "0"]
    command += ["--report_to", "none", "--use_cpu", "true"]
    result = run(command)
    scores = json.loads((output / "test_scores.json").read_text())
    assert scores["global_step"] == 2 and "tok:13a" in scores["bleu_signature"]
    assert len((output / "test_translations.txt").read_text().splitlines()) == 8  # newstest2014's stand-in
    assert (output / "averaged" / "model.safetensors").exists()
    assert "Averaging 2 checkpoints" in result.stderr
    card = json.loads((output / "hyperparameters.json").read_text())
    assert card["max_tokens_per_batch"] == 512 and card["label_smoothing"] == 0.1
