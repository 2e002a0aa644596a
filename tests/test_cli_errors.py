"""A user's mistake at the command line gets one line, `hf-vanilla COMMAND: error: what and the fix`, exit status 2,
no traceback; `--debug` or HF_VANILLA_DEBUG=1 shows the traceback. Each mistake runs the command's `main` in this
process (what `python -m hf_vanilla` and the `hf-vanilla` script call); the traceback test runs the real executable,
as a user does, and sees the status and the last line there too."""

import os
import subprocess
import sys

import pytest


def hf_vanilla(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hf_vanilla", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def built_places(tmp_path_factory, trained_small_tokenizer):
    folder = tmp_path_factory.mktemp("cli")
    (folder / "wrong_shape").mkdir()
    (folder / "wrong_shape" / "notes.txt").write_text("no parallel data here")
    from .conftest import make_model

    make_model(vocab_size=61).save_pretrained(folder / "model")  # 61 ids: fewer than the tokenizer's 400
    trained_small_tokenizer.save_pretrained(folder / "tokenizer")
    (folder / "source.txt").write_text("A dog.\n")
    return folder


@pytest.fixture
def places(built_places, own):
    return own(built_places)


CASES = {
    "train, data folder in the wrong shape": (
        ["train", "--data", "{p}/wrong_shape", "--output_dir", "{p}/run"],
        "train",
        "No parallel data in",
    ),
    "train, missing data folder": (
        ["train", "--data", "{p}/missing", "--output_dir", "{p}/run"],
        "train",
        "not a folder",
    ),
    "train, split_batches with token budgets": (
        ["train", "--accelerator_config", '{{"split_batches": true}}', "--output_dir", "{p}/run"],
        "train",
        "split_batches=True cannot split token-budget batches",
    ),
    "translate, missing model folder": (["translate", "{p}/no_model"], "translate", "no such folder; give the folder"),
    "translate, missing input file": (
        ["translate", "{p}/model", "--input", "{p}/missing.txt"],
        "translate",
        "--input {p}/missing.txt: no such file",
    ),
    "translate, a tokenizer from another run": (
        ["translate", "{p}/model", "--tokenizer", "{p}/tokenizer", "--input", "{p}/source.txt"],
        "translate",
        "The tokenizer has 400 entries but the model's vocabulary only 61",
    ),
    "average, no checkpoints": (
        ["average", "--from", "{p}/wrong_shape", "--output", "{p}/avg"],
        "average",
        "no checkpoints",
    ),
    "export, an option of the other engine": (
        ["export", "ctranslate2", "{p}/model", "{p}/out", "--opset", "18"],
        "export",
        "--opset is for onnx",
    ),
    "tokenizer, missing file": (
        ["tokenizer", "--files", "{p}/missing.en", "--output", "{p}/tok"],
        "tokenizer",
        "No such file or directory",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_mistake_gets_one_line_and_status_2(places, case, capsys, monkeypatch):
    from hf_vanilla.commands import main

    monkeypatch.delenv("HF_VANILLA_DEBUG", raising=False)
    args, command, message = CASES[case]
    with pytest.raises(SystemExit) as mistake:
        main([arg.format(p=places) for arg in args])
    stderr = capsys.readouterr().err
    assert mistake.value.code == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"hf-vanilla {command}: error: ") and message.format(p=places) in last, last


def test_debug_shows_the_traceback(places, monkeypatch):
    """The executable, as a user runs it, ends with the one line and status 2; with `--debug` or HF_VANILLA_DEBUG=1
    the error leaves `main` as it was raised, for the interpreter to print with its traceback."""
    from hf_vanilla.commands import main

    missing = str(places / "no_model")
    plain = hf_vanilla("translate", missing)
    last = plain.stderr.strip().splitlines()[-1]
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert last.startswith("hf-vanilla translate: error: "), last
    monkeypatch.delenv("HF_VANILLA_DEBUG", raising=False)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        main(["--debug", "translate", missing])
    monkeypatch.setenv("HF_VANILLA_DEBUG", "1")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        main(["translate", missing])
