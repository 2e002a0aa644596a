"""A published folder is complete: it loads in a Python without hf_vanilla, and its card's metadata validates."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from huggingface_hub import ModelCard, metadata_load
from packaging.version import Version

from hf_vanilla.hub import CardInfo, dry_run, write_hub_folder

from .conftest import make_model, run_without_hf_vanilla


SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
CARD = CardInfo(
    repo_id="someone/vanilla-en-de",
    bleu=35.12,
    chrf=60.3,
    signature=SIGNATURE,
    hyperparameters={"learning_rate": 0.005, "warmup_steps": 2000},
)


@pytest.fixture(scope="module")
def built_hub_folder(trained_small_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hub")
    model = make_model(seed=11, vocab_size=len(trained_small_tokenizer), init_std=1.0)
    model.generation_config.num_beams = 1  # publishing must restore the paper's decoding defaults
    write_hub_folder(model, trained_small_tokenizer, folder, CARD)
    assert model.generation_config.num_beams == 1  # ... in the folder, leaving the caller's model as it was
    return folder, model, trained_small_tokenizer


@pytest.fixture
def published(built_hub_folder, own):
    return own(built_hub_folder)


ROOT = Path(__file__).parents[1]


def test_folder_has_every_file(published):
    folder, _, _ = published
    names = {path.name for path in folder.iterdir()}
    assert names >= {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "configuration_vanilla.py",
        "modeling_vanilla.py",
        "pipeline_vanilla.py",
        "README.md",
    }
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in names)
    config = json.loads((folder / "config.json").read_text())
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_vanilla.VanillaTranslationPipeline"
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"]) == (4, 0.6)


def test_card_metadata_validates(published):
    folder, _, _ = published
    metadata = metadata_load(folder / "README.md")
    assert metadata["language"] == ["en", "de"] and metadata["license"] == "apache-2.0"
    assert metadata["pipeline_tag"] == "translation" and "bentrevett/multi30k" in metadata["datasets"]
    card = ModelCard.load(folder / "README.md")  # parses model-index back into EvalResults
    bleu = next(result for result in card.data.eval_results if result.metric_type == "bleu")
    assert bleu.metric_value == 35.12 and bleu.metric_config == SIGNATURE and bleu.task_type == "translation"
    text = card.text
    for section in ("## Results", "## Use", "## Training", "## Intended use and limitations", "## Citation"):
        assert section in text
    assert "| learning_rate | 0.005 |" in text and "someone/vanilla-en-de" in text
    # the transformers releases the remote code was tested with: its floor and the lock's version, with the table
    locked = next(
        line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("transformers==")
    )
    assert f"tested with transformers 5.10\nto {locked.split('==')[1]}:" in text
    assert f"| 5.10.4 to {locked.split('==')[1]} (15 releases) | works: cached == uncached" in text
    assert (
        "| 5.0.0 to 5.9.0 (10 releases) | refused at once, on 5.0.0: `ImportError: This hf_vanilla model needs" in text
    )


def test_bleu_without_signature_is_refused(tmp_path):
    with pytest.raises(ValueError, match="signature"):
        write_hub_folder(make_model(), _FakeTokenizer(), tmp_path / "out", CardInfo(bleu=30.0))
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


class _FakeTokenizer:
    def __len__(self):
        return 10


REMOTE_HUB_LOAD = """
import json, sys
sys.modules["hf_vanilla"] = None
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, pipeline
folder = sys.argv[1]
kinds = [type(cls.from_pretrained(folder, trust_remote_code=True)).__name__
         for cls in (AutoConfig, AutoModel, AutoModelForSeq2SeqLM)]
translator = pipeline("translation", model=folder, trust_remote_code=True,
                      model_kwargs={"attn_implementation": "eager"})
print(json.dumps({"kinds": kinds, "translation": translator("A dog runs.", max_new_tokens=8)[0]["translation_text"]}))
"""


def test_published_folder_loads_without_hf_vanilla(published, tmp_path):
    folder, model, tokenizer = published
    result = json.loads(run_without_hf_vanilla(REMOTE_HUB_LOAD, [str(folder)], tmp_path).strip().splitlines()[-1])
    assert result["kinds"] == [
        "VanillaTransformerConfig",
        "VanillaTransformerModel",
        "VanillaTransformerForConditionalGeneration",
    ]
    expected = model.generate(
        **tokenizer("A dog runs.", return_tensors="pt"), max_new_tokens=8, num_beams=4, length_penalty=0.6
    )
    assert result["translation"] == tokenizer.decode(expected[0], skip_special_tokens=True)


REMOTE_LOAD_ON_A_RELEASE = """
import json, sys
sys.modules["hf_vanilla"] = None
import transformers
transformers.__version__ = sys.argv[2]  # the release the remote code reads, as if it were installed
from transformers import AutoConfig
try:
    kind = type(AutoConfig.from_pretrained(sys.argv[1], trust_remote_code=True)).__name__
except ImportError as error:
    print(json.dumps({"refused": str(error)}))
else:
    print(json.dumps({"loaded": kind}))
"""


@pytest.mark.parametrize("release", ["5.9.2", "5.10.0.dev0"])
def test_remote_code_refuses_a_release_below_its_floor_in_one_line(published, tmp_path, release):
    """The saved config's own check, on a simulated older release: below the floor, one line naming the release and
    the command; a development build of the floor's release is that release."""
    from hf_vanilla.configuration_vanilla import TRANSFORMERS_FLOOR

    folder, _, _ = published
    script = REMOTE_LOAD_ON_A_RELEASE
    result = json.loads(run_without_hf_vanilla(script, [str(folder), release], tmp_path).strip().splitlines()[-1])
    if Version(release).release < Version(TRANSFORMERS_FLOOR).release:
        assert result == {
            "refused": f"This hf_vanilla model needs transformers >= {TRANSFORMERS_FLOOR}, and transformers {release} "
            f"is installed: pip install -U 'transformers>={TRANSFORMERS_FLOOR}'"
        }
    else:
        assert result == {"loaded": "VanillaTransformerConfig"}


def test_dry_run_lists_the_folder_it_would_write_and_leaves_nothing(published, tmp_path, monkeypatch):
    folder, model, tokenizer = published
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where its scratch folder goes, to see it removed
    listing = dry_run(model, tokenizer, CARD)
    written = {path.name: path.stat().st_size for path in folder.iterdir()}  # the fixture's write_hub_folder
    assert {line.split("\t")[0] for line in listing} == set(written)
    assert f"model.safetensors\t{written['model.safetensors']} bytes" in listing
    assert list(tmp_path.iterdir()) == []


def test_push_without_token_fails_clearly(published, tmp_path):
    folder, _, _ = published
    env = {key: value for key, value in os.environ.items() if key not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_vanilla",
            "publish",
            str(folder),
            str(tmp_path / "out"),
            "--push-to-hub",
            "me/model",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "needs network access and a token" in result.stderr
    assert (tmp_path / "out" / "model.safetensors").exists()  # the folder is written before the upload is tried


def test_the_cards_tested_range_is_the_release_sweeps():
    """docs/results/transformers-releases-cpu.json (benchmarks/transformers_releases.py): every 5.x minor release
    from the remote-code floor to the lock's transformers passes, every one below it is refused in one line, and the
    card names exactly that range."""
    from hf_vanilla.configuration_vanilla import TRANSFORMERS_FLOOR
    from hf_vanilla.env import range_tested

    results = json.loads((ROOT / "docs" / "results" / "transformers-releases-cpu.json").read_text())["results"]
    floor, newest = Version(TRANSFORMERS_FLOOR), range_tested("transformers")[1]
    releases = [Version(result["transformers"]) for result in results]
    assert releases == sorted(releases) and releases[-1] == newest and releases[0].release[:2] == (5, 0)
    minors = {release.release[:2] for release in releases}
    assert minors == {(5, minor) for minor in range(newest.minor + 1)}  # none left out
    for result, release in zip(results, releases, strict=True):
        expected = "pass" if release.release[:2] >= floor.release else "refused"
        assert result["verdict"] == expected, result
        if expected == "pass":  # a trained model's translations, token for token those of the package on the lock
            assert result["compared"] >= 200 and result["differences"] == [], result
            assert result["identical"] == {"greedy": result["compared"], "beam4": result["compared"]}, result
