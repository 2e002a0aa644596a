"""hf_vanilla: the original Transformer (Vaswani et al. 2017) as a transformers model family.

Importing the package registers the config and models with `AutoConfig`, `AutoModel` and
`AutoModelForSeq2SeqLM`, and marks them for `save_pretrained` to write `auto_map`, `custom_pipelines` and the
remote-code files, so a saved folder also loads and translates with `trust_remote_code=True` where hf_vanilla is not
installed.

Its one effect on the rest of transformers, deliberate, made here at import and tested: it serves the task
`"translation"` and its `translation_<source>_to_<target>` names, which transformers 5 removed (they raised
`KeyError`), with `VanillaTranslationPipeline`. That pipeline gives any other seq2seq model (MarianMT, T5, ...)
exactly what the model's own `generate()` and generation config give; only hf_vanilla models get the paper's source
+ 50 length budget. Every other task is left as transformers leaves it, and building a model or a config changes no
global state.
"""

from .env import check_installation


check_installation()  # before anything of a library below its floor (or a Python too old) can fail obscurely

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM  # noqa: E402
from transformers.pipelines import PIPELINE_REGISTRY, REMOVED_TASKS  # noqa: E402

from .configuration_vanilla import VanillaTransformerConfig  # noqa: E402
from .modeling_vanilla import (  # noqa: E402
    VanillaDecoder,
    VanillaEncoder,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
)
from .pipeline_vanilla import VanillaTranslationPipeline  # noqa: E402


__version__ = "0.1.0"

AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)

VanillaTransformerConfig.register_for_auto_class()
VanillaTransformerModel.register_for_auto_class("AutoModel")
VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")


class TranslationTaskAliases(dict):
    """The registry's task aliases, answering `translation_<source>_to_<target>` for any language codes with
    `translation` (as transformers 4 parsed such names; 5 removed that with the task). The pipeline then checks the
    name against the model's own languages."""

    def __contains__(self, task: object) -> bool:
        return super().__contains__(task) or self._is_language_pair(task)

    def __missing__(self, task: str) -> str:
        if self._is_language_pair(task):
            return "translation"
        raise KeyError(task)

    @staticmethod
    def _is_language_pair(task: object) -> bool:
        if not isinstance(task, str) or not task.startswith("translation_"):
            return False
        source, separator, target = task.removeprefix("translation_").partition("_to_")
        return bool(source and separator and target)


# The package's only change to the rest of transformers, made here once: transformers 5 removed "translation" (it
# raises KeyError before looking at the registry); serve it again, for every seq2seq model (see the module
# docstring), with its language-pair names.
REMOVED_TASKS.pop("translation", None)
if PIPELINE_REGISTRY.supported_tasks.get("translation", {}).get("impl") is not VanillaTranslationPipeline:
    PIPELINE_REGISTRY.register_pipeline(
        "translation", pipeline_class=VanillaTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
    )
if not isinstance(PIPELINE_REGISTRY.task_aliases, TranslationTaskAliases):
    PIPELINE_REGISTRY.task_aliases = TranslationTaskAliases(PIPELINE_REGISTRY.task_aliases)

__all__ = [
    "VanillaDecoder",
    "VanillaEncoder",
    "VanillaTransformerConfig",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "VanillaTranslationPipeline",
]
