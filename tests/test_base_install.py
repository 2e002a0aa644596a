"""The base install (`pip install hf-vanilla`, no extras) runs inference: `translate`, `pipeline("translation")`,
`env`; a command that needs an extra says which, in one line. Each runs in a fresh Python where the extras' libraries
cannot be imported (CI's base-install leg runs the same commands in a virtual environment without them)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import make_model


# The top-level modules of the extras' libraries (pyproject.toml: train, export, openvino, bench) that the base
# install lacks (pyyaml is one too, but huggingface_hub requires it).
EXTRAS_MODULES = (
    "datasets", "pyarrow", "accelerate", "evaluate", "sacrebleu", "matplotlib", "tensorboard", "onnx",
    "onnxscript", "onnxruntime", "ctranslate2", "openvino", "psutil",
)  # fmt: skip

# None in sys.modules: `import` raises ModuleNotFoundError naming the module, and `importlib.util.find_spec` (how
# transformers tells what is installed) returns None, as for a library that is not installed.
BLOCK_EXTRAS = f"import sys\nsys.modules.update(dict.fromkeys({EXTRAS_MODULES!r}))\n"


def without_extras(code: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", BLOCK_EXTRAS + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )


@pytest.fixture(scope="module")
def built_model(tmp_path_factory, trained_small_tokenizer):
    folder = tmp_path_factory.mktemp("base") / "model"
    tokenizer = trained_small_tokenizer
    make_model(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
               bos_token_id=tokenizer.bos_token_id, decoder_start_token_id=tokenizer.bos_token_id,
               unk_token_id=tokenizer.unk_token_id).save_pretrained(folder)  # fmt: skip
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def saved_model(built_model, own):
    return own(built_model)


def test_translate_pipeline_and_env_run_without_the_extras(saved_model, tmp_path):
    (tmp_path / "source.txt").write_text("A dog runs.\nTwo men talk.\n")
    run = without_extras(
        f"""
        import json
        from hf_vanilla.commands import main
        from transformers import pipeline
        main(["translate", {str(saved_model)!r}, "--input", "source.txt", "--output", "out.txt", "--beam", "2"])
        main(["env"])
        translator = pipeline("translation", model={str(saved_model)!r})
        print(json.dumps([o["translation_text"] for o in translator(["A dog runs.", "Two men talk."], num_beams=2)]))
        """,
        tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith("hf-vanilla ") and any(line.startswith("transformers ") for line in lines)
    from hf_vanilla.commands import main

    main(["translate", str(saved_model), "--input", str(tmp_path / "source.txt"), "--beam", "2",
          "--output", str(tmp_path / "full.txt")])  # fmt: skip
    assert (tmp_path / "out.txt").read_text() == (tmp_path / "full.txt").read_text()  # as with every extra installed
    assert len(json.loads(lines[-1])) == 2


def test_a_command_that_needs_an_extra_names_it(tmp_path):
    run = without_extras(
        """
        from hf_vanilla.commands import main
        main(["train", "--output_dir", "run"])
        """,
        tmp_path,
    )
    assert run.returncode == 2
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .startswith("hf-vanilla train: error: this command needs the [train] extra: pip install 'hf-vanilla[train]' (")
    )
