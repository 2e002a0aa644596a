"""The private parts of transformers that hf_vanilla relies on (`hf_vanilla.library_hooks`), checked against the
installed library: when a release changes one, these fail and say which, before any behaviour test does."""

import inspect

import transformers
from transformers import CompileConfig, GenerationMixin, Seq2SeqTrainer, Trainer

from hf_vanilla.library_hooks import MODEL_METHODS, TRAINER_METHODS, compile_on_every_device
from hf_vanilla.training import TokenBudgetSeq2SeqTrainer


def test_the_trainer_methods_overridden_are_still_the_librarys():
    for name, parameters in TRAINER_METHODS.items():
        assert hasattr(Seq2SeqTrainer, name), f"transformers no longer has Trainer.{name}: see library_hooks.py"
        library = list(inspect.signature(getattr(Seq2SeqTrainer, name)).parameters)
        assert library == parameters, f"Trainer.{name} now takes {library}: see library_hooks.py"
        assert name in vars(TokenBudgetSeq2SeqTrainer), f"library_hooks.TRAINER_METHODS lists {name}, not overridden"
    # The staging folder works only while the library's save writes where `_get_output_dir` says.
    assert "self._get_output_dir(" in inspect.getsource(Trainer._save_checkpoint), (
        "Trainer._save_checkpoint no longer asks _get_output_dir where to write: see library_hooks.py"
    )
    # A resume starts where `_init_training_state` says: the epoch, and the batches of it to skip.
    assert "= self._init_training_state(" in inspect.getsource(Trainer._inner_training_loop), (
        "Trainer._inner_training_loop no longer asks _init_training_state where to resume: see library_hooks.py"
    )


def test_generate_still_reads_the_flag_that_compiles_on_every_device():
    assert compile_on_every_device(CompileConfig())._compile_all_devices is True
    assert "compile_config._compile_all_devices" in inspect.getsource(GenerationMixin._valid_auto_compile_criteria), (
        "generate() no longer reads CompileConfig._compile_all_devices: see library_hooks.py"
    )


def test_the_model_hooks_overridden_or_called_are_still_the_librarys():
    for (owner, name), parameters in MODEL_METHODS.items():
        method = getattr(getattr(transformers, owner), name, None)
        assert method is not None, f"transformers no longer has {owner}.{name}: see library_hooks.py"
        library = list(inspect.signature(method).parameters)[: len(parameters)]
        assert library == parameters, f"{owner}.{name} now takes {library}: see library_hooks.py"
