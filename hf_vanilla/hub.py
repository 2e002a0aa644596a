"""Turn a trained model and its tokenizer into a complete Hub folder, and upload it."""

import copy
import importlib.metadata
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .configuration_vanilla import TRANSFORMERS_FLOOR
from .env import range_tested, shipped_file
from .modeling_vanilla import PAPER_DECODING
from .pipeline_vanilla import VanillaTranslationPipeline, check_tokenizer_matches_model


def default_card_template() -> Path:
    """The repository's top-level `model_card.md`, as wheels and checkouts carry it."""
    return shipped_file("model_card.md")


LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "cs": "Czech", "es": "Spanish"}


@dataclass
class CardInfo:
    """What the model card says beyond what the model and tokenizer already tell."""

    repo_id: str = "your-name/your-model"
    source_language: str = "en"
    target_language: str = "de"
    license: str = "apache-2.0"
    datasets: list[str] = field(default_factory=lambda: ["bentrevett/multi30k"])
    dataset_description: str = "Multi30k English-German (29,000 training pairs of image descriptions)."
    test_set: str = "Multi30k test2016"
    bleu: float | None = None
    chrf: float | None = None
    signature: str | None = None
    example_source: str = "A man in a blue shirt is standing on a ladder."
    hyperparameters: dict = field(default_factory=dict)


def render_model_card(model: PreTrainedModel, card: CardInfo, template_path: str | Path | None = None) -> ModelCard:
    """The card: YAML metadata (languages, license, datasets, metrics, model-index) and the template's sections."""
    if card.bleu is not None and not card.signature:
        raise ValueError("A BLEU score needs its sacreBLEU `signature`, so readers know how it was computed.")
    eval_results = None
    if card.bleu is not None:
        common = dict(
            task_type="translation",
            task_name=f"Translation {card.source_language}-{card.target_language}",
            dataset_type=card.datasets[0] if card.datasets else "custom",
            dataset_name=card.test_set,
            dataset_split="test",
        )
        eval_results = [
            EvalResult(
                metric_type="bleu",
                metric_name="sacreBLEU",
                metric_value=card.bleu,
                metric_config=card.signature,
                **common,
            )
        ]
        if card.chrf is not None:
            eval_results.append(EvalResult(metric_type="chrf", metric_value=card.chrf, **common))
    model_name = card.repo_id.split("/")[-1]
    card_data = ModelCardData(
        language=[card.source_language, card.target_language],
        license=card.license,
        datasets=card.datasets or None,
        metrics=["bleu", "chrf"],
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", "hf_vanilla", "vanilla_transformer", "custom_code"],
        model_name=model_name,
        eval_results=eval_results,
    )
    generation = model.generation_config
    _, transformers_newest = range_tested("transformers")
    return ModelCard.from_template(
        card_data,
        template_path=str(template_path or default_card_template()),
        model_name=model_name,
        repo_id=card.repo_id,
        source_language_name=LANGUAGE_NAMES.get(card.source_language, card.source_language),
        target_language_name=LANGUAGE_NAMES.get(card.target_language, card.target_language),
        bleu=card.bleu,
        chrf=card.chrf,
        signature=card.signature,
        test_set=card.test_set,
        example_source=card.example_source,
        num_beams=generation.num_beams,
        length_penalty=generation.length_penalty,
        config=model.config,
        num_parameters=model.num_parameters(),
        hyperparameters=card.hyperparameters,
        dataset_description=card.dataset_description,
        datasets=card.datasets,
        cite_multi30k=any("multi30k" in name.lower() for name in card.datasets),
        hf_vanilla_version=importlib.metadata.version("hf-vanilla"),
        transformers_floor=TRANSFORMERS_FLOOR,
        transformers_newest=transformers_newest,
    )


def write_hub_folder(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: str | Path,
    card: CardInfo,
    template_path: str | Path | None = None,
) -> list[Path]:
    """Write weights (safetensors), config with `auto_map` and `custom_pipelines`, the remote-code files, the
    tokenizer, `generation_config.json` with the paper's decoding defaults (`PAPER_DECODING`), and `README.md`.
    Returns the files; `model` itself is left as it was."""
    check_tokenizer_matches_model(tokenizer, model.config)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    caller_generation_config = model.generation_config
    model.generation_config = copy.deepcopy(caller_generation_config)
    model.generation_config.update(**PAPER_DECODING)
    try:
        model_card = render_model_card(model, card, template_path)  # before writing anything: it validates `card`
        VanillaTranslationPipeline(model=model, tokenizer=tokenizer).save_pretrained(output_dir)
    finally:
        model.generation_config = caller_generation_config
    model_card.save(output_dir / "README.md")
    return sorted(path for path in output_dir.iterdir() if path.is_file())


def push_folder(folder: str | Path, repo_id: str, private: bool = False, token: str | None = None) -> str:
    """Upload a folder written by `write_hub_folder`; clear errors without a token or network."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError, OfflineModeIsEnabled

    api = HfApi(token=token)
    try:
        api.whoami()
    except (LocalTokenNotFoundError, OfflineModeIsEnabled, HfHubHTTPError, OSError) as error:
        raise RuntimeError(
            f"Cannot push to the Hub ({type(error).__name__}: {error}). Pushing needs network access and a token: "
            "run `hf auth login` or set HF_TOKEN, and unset HF_HUB_OFFLINE."
        ) from error
    api.create_repo(repo_id, private=private, exist_ok=True)
    commit = api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message="Upload hf_vanilla model")
    return commit.commit_url


def dry_run(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, card: CardInfo, **kwargs) -> list[str]:
    """The files `write_hub_folder` would write, with sizes, leaving nothing behind."""
    with tempfile.TemporaryDirectory() as scratch:
        files = write_hub_folder(model, tokenizer, scratch, card, **kwargs)
        return [f"{path.name}\t{path.stat().st_size} bytes" for path in files]


def load_hyperparameters(path: str | Path | None) -> dict:
    """Hyper-parameters for the card from a JSON file (e.g. the training run's arguments), or none."""
    if path is None:
        return {}
    return json.loads(Path(path).read_text(encoding="utf-8"))
