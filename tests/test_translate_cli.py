"""`translate_lines` and `hf-vanilla translate`: line i of the output translates line i of the input whatever the
buffer, budget, blank lines, invalid bytes or engine; batching changes nothing; output comes as buffers finish."""

import queue
import subprocess
import sys
import threading

import pytest
import torch
from transformers import AutoTokenizer

from hf_vanilla.inference import GenerateTranslator, translate_lines, translate_stream
from hf_vanilla.plotting import plot_cross_attention

from .conftest import REVERSAL_SOURCES, make_model


LINES = ["Two children play.", "A woman in a red dress sings on a stage in front of many people.", "A dog.", "Hi"]


@pytest.fixture(scope="module")
def built_model(trained_small_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    # Peaked, source-dependent outputs from a random model (see test_generation's fixture).
    model = make_model(seed=7, vocab_size=len(trained_small_tokenizer), init_std=1.0, qkv_init_gain=1.0)
    model.save_pretrained(folder)
    trained_small_tokenizer.save_pretrained(folder)
    return folder, model, trained_small_tokenizer


@pytest.fixture
def saved_model(built_model, own):
    return own(built_model)


def test_batched_by_length_equals_one_by_one_in_input_order(saved_model):
    _, model, tokenizer = saved_model
    # a = 0, b = 9: a fixed budget, so the never-stopping random model's outputs compare across batch shapes.
    options = dict(length_ratio=0.0, length_offset=9, progress=False, num_beams=1)
    batched = translate_lines(model, tokenizer, LINES, batch_size=3, **options)
    alone = [translate_lines(model, tokenizer, [line], batch_size=1, **options)[0] for line in LINES]
    assert batched == alone and len(batched) == len(LINES)
    nbest = translate_lines(
        model, tokenizer, LINES, batch_size=2, num_return_sequences=2, **{**options, "num_beams": 3}
    )
    assert all(len(candidates) == 2 for candidates in nbest)


def test_length_budget_is_a_times_source_plus_b(saved_model):
    _, model, tokenizer = saved_model
    (translation,) = translate_lines(model, tokenizer, ["A dog."], length_ratio=2.0, length_offset=1, num_beams=1)
    source_length = len(tokenizer("A dog.")["input_ids"])
    produced = tokenizer(translation[0], add_special_tokens=False)["input_ids"]
    assert 0 < len(produced) <= 2 * source_length + 1 + 2  # re-tokenising decoded bytes may merge differently


WITH_BLANKS = ["A dog.", "", "Two children play.", "   ", "Hi", "A woman sings on a stage.", "", "Rain."]
MODES = {
    "greedy": dict(num_beams=1),
    "beam": dict(num_beams=3),
    "nbest": dict(num_beams=3, num_return_sequences=2),
    "sample": dict(do_sample=True, num_beams=1, top_k=0),
}


@pytest.mark.parametrize("mode", MODES, ids=list(MODES))
def test_stream_keeps_lines_aligned_and_equals_translate_lines(saved_model, mode):
    _, model, tokenizer = saved_model
    options = dict(length_ratio=0.0, length_offset=7, **MODES[mode])
    torch.manual_seed(0)
    expected = translate_lines(model, tokenizer, WITH_BLANKS, progress=False, **options)
    assert [i for i, candidates in enumerate(expected) if not candidates] == [1, 3, 6]  # blank in, blank out
    translate = GenerateTranslator(model, tokenizer, **options)
    # Sampling draws from one random stream, so it matches only batch for batch; search matches for any buffer.
    for buffer_size, max_tokens in [(len(WITH_BLANKS), 10**9)] if mode == "sample" else [(3, 10**9), (2, 12), (1, 1)]:
        torch.manual_seed(0)
        streamed = list(translate_stream(translate, tokenizer, iter(WITH_BLANKS), buffer_size, max_tokens, 128))
        assert streamed == expected, (buffer_size, max_tokens)


def test_batches_keep_to_the_token_budget_and_a_long_line_goes_alone(small_tokenizer):
    lines = [" ".join(["a"] * n) for n in (1, 2, 3, 30, 4, 5, 2, 1)]
    batches = []

    def record(sources):
        batches.append([len(ids) for ids in sources])
        return [[str(len(ids))] for ids in sources]

    out = list(translate_stream(record, small_tokenizer, lines, buffer_size=100, max_tokens=12, max_sentences=3))
    lengths = [len(ids) for ids in small_tokenizer(lines)["input_ids"]]
    assert out == [[str(n)] for n in lengths]  # in input order
    assert max(lengths) > 12 and [max(lengths)] in batches  # over the budget: translated, alone
    assert all(len(b) <= 3 and (len(b) * max(b) <= 12 or len(b) == 1) for b in batches)


def test_a_bad_line_stops_the_stream_after_the_lines_before_it(small_tokenizer):
    def lines():
        yield "one"
        yield "two"
        raise ValueError("input.txt: line 3 is not valid UTF-8")

    translated = []
    with pytest.raises(ValueError, match="line 3"):
        for candidates in translate_stream(lambda s: [["x"]] * len(s), small_tokenizer, lines(), buffer_size=10):
            translated.append(candidates)
    assert translated == [["x"], ["x"]]


def translate_command(*args: str, stdin: bytes | None = None, env=None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hf_vanilla", *args]
    return subprocess.run(command, input=stdin, capture_output=True, timeout=300, env=env)


def test_cli_invalid_utf8_stops_with_file_and_line_after_writing_what_came_before(saved_model, tmp_path):
    folder, _, _ = saved_model
    source = tmp_path / "input.txt"
    source.write_bytes(b"A dog.\n\nTwo children play.\n\xff\xfe broken\nHi\n")
    output = tmp_path / "out.txt"
    options = ["--input", str(source), "--output", str(output), "--beam", "1", "--max-len-a", "0", "--max-len-b", "5"]
    result = translate_command("translate", str(folder), *options, "--no-progress")
    assert result.returncode == 2 and b"Traceback" not in result.stderr
    last = result.stderr.decode().strip().splitlines()[-1]
    assert last.startswith(f"hf-vanilla translate: error: {source}: line 4 is not valid UTF-8")
    assert b"--errors replace" in result.stderr
    written = output.read_text().split("\n")[:-1]
    assert len(written) == 3 and written[1] == "" and written[0] and written[2]  # lines 1-3, blank kept
    result = translate_command("translate", str(folder), *options, "--no-progress", "--errors", "replace")
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(output.read_text().split("\n")[:-1]) == 5


def test_cli_writes_each_buffer_as_soon_as_it_is_done(saved_model):
    folder, _, _ = saved_model
    command = [sys.executable, "-m", "hf_vanilla", "translate", str(folder), "--buffer-size", "2", "--no-progress"]
    command += ["--beam", "1", "--max-len-a", "0", "--max-len-b", "4"]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    lines = queue.Queue()  # read by a thread, so that a line that never comes fails the test instead of hanging it
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    try:
        process.stdin.write(b"A dog.\n\n")
        process.stdin.flush()
        # the first buffer's two lines come back while the input is still open
        assert lines.get(timeout=120).strip() and lines.get(timeout=120) == b"\n"
        process.stdin.write(b"Hi\n")
        process.stdin.close()
        assert lines.get(timeout=120).strip() and process.wait(timeout=120) == 0
    finally:
        process.kill()


def test_cli_reads_stdin_and_draws_attention(saved_model, tmp_path):
    folder, model, _ = saved_model
    plot = tmp_path / "attention.png"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_vanilla",
            "translate",
            str(folder),
            "--beam",
            "1",
            "--max-len-a",
            "0",
            "--max-len-b",
            "9",
            "--batch-size",
            "2",
            "--attention-plot",
            str(plot),
            "--no-progress",
        ],
        input="\n".join(LINES) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    expected = translate_lines(model, tokenizer, LINES, length_ratio=0.0, length_offset=9, progress=False, num_beams=1)
    assert result.stdout.split("\n")[:-1] == [candidates[0] for candidates in expected]  # not splitlines: \x1e etc.
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_attention_plot_returns_the_translation(saved_model, tmp_path):
    _, model, tokenizer = saved_model
    text = plot_cross_attention(model, tokenizer, LINES[0], tmp_path / "a.png", max_new_tokens=6, num_beams=1)
    assert text == translate_lines(model, tokenizer, LINES[:1], length_ratio=0, length_offset=6, num_beams=1)[0][0]
    assert model.config._attn_implementation == "eager"  # restored


@pytest.mark.parametrize("decoding", [["--beam", "1"], ["--beam", "4", "--length-penalty", "1.0", "--nbest", "2"]])
def test_every_engine_gives_the_pytorch_translations_line_for_line(reversal_exports, tmp_path, decoding):
    from hf_vanilla.commands import main

    lines = [" ".join(f"t{i}" for i in ids) + " </s>" for ids in REVERSAL_SOURCES[:20]]  # trained with EOS
    source = tmp_path / "source.txt"
    source.write_text("\n".join([*lines[:5], "", *lines[5:]]) + "\n")
    outputs = {}
    for engine, folder in reversal_exports.items():
        output = tmp_path / f"{engine}.txt"
        files = ["--input", str(source), "--output", str(output)]
        main(["translate", str(folder), "--engine", engine, *files, *decoding])
        outputs[engine] = output.read_text()
    expected = outputs["pytorch"].split("\n")
    assert len(expected) == 22 and expected[5] == "" and expected[0].split("\t")[0] == "t7 t13 t9 t5"
    assert len(expected[0].split("\t")) == (2 if "--nbest" in decoding else 1)
    assert {"onnx", "ctranslate2"} <= set(outputs)
    # The exports run transformers' own generate(): every candidate is PyTorch's. CTranslate2 runs its own beam
    # search, which keeps other runners-up: its best candidates are PyTorch's.
    generate_engines = [engine for engine in outputs if engine != "ctranslate2"]
    assert all(outputs[engine] == outputs["pytorch"] for engine in generate_engines), generate_engines
    best = [line.split("\t")[0] for line in outputs["ctranslate2"].split("\n")]
    assert best == [line.split("\t")[0] for line in expected]


def test_options_an_engine_cannot_honour_are_refused(reversal_exports, tmp_path, capsys):
    # In this process: each refusal comes before a model is loaded (`test_cli_errors.py` runs the command's exit
    # status and one-line message in a subprocess).
    from hf_vanilla.commands import main

    onnx, pytorch = str(reversal_exports["onnx"]), str(reversal_exports["pytorch"])
    for args, message in [
        (
            [onnx, "--engine", "onnx", "--attention-plot", str(tmp_path / "a.png")],
            "--attention-plot needs the PyTorch",
        ),
        ([pytorch, "--compute-type", "int8"], "--compute-type is for --engine ctranslate2"),
        *(  # sampling options without --sample, on every engine
            ([str(folder), "--engine", engine, option, value], "need --sample")
            for engine, folder in reversal_exports.items()
            for option, value in (("--top-k", "5"), ("--temperature", "0.7"))
        ),
    ]:
        with pytest.raises(SystemExit) as refused:
            main(["translate", *args])
        stderr = capsys.readouterr().err
        assert refused.value.code == 2 and message in stderr and stderr.count("\n") == 1, stderr[-2000:]
