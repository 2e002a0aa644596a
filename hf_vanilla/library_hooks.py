"""The private parts of transformers that hf_vanilla relies on, each where no public hook serves, gathered here so
that a release that changes one (`transformers>=5.23,<6` allows any minor release) breaks in one known place, loudly:
`tests/test_library_hooks.py` checks each against the installed library and names what moved.

- `Trainer._save_checkpoint(model, trial)` and `Trainer._get_output_dir(trial)` (`TRAINER_METHODS`), overridden by
  `training.trainer.TokenBudgetSeq2SeqTrainer` for checkpoints that appear whole or not at all. The library writes a
  checkpoint straight into `<run_dir>/checkpoint-N`, and the callbacks' `on_save` runs only once it is written;
  the trainer has `_get_output_dir` answer a staging folder while `_save_checkpoint` writes, then renames it.
- `Trainer._init_training_state(max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint,
  trial)`, which returns the epoch to resume and the batches of it to skip: the library counts both from
  `global_step` in updates of the resuming run's size, so a checkpoint written by another number of processes (or
  accumulation) would resume elsewhere. The trainer answers the checkpoint's own position instead.
- `CompileConfig._compile_all_devices` (`compile_on_every_device`): `generate()` compiles its decoding step only on
  accelerators unless this flag is set (transformers' own CPU tests set it).
- The model hooks the library's own models override or call (`MODEL_METHODS`; MarianMT uses the same): the resizing
  of embeddings (the library's would resize an untied output layer with the source vocabulary).
"""

from transformers import CompileConfig


# name -> the parameters the override relies on
TRAINER_METHODS = {
    "_save_checkpoint": ["self", "model", "trial"],
    "_get_output_dir": ["self", "trial"],
    "_init_training_state": [
        "self",
        "max_steps",
        "num_update_steps_per_epoch",
        "num_train_epochs",
        "resume_from_checkpoint",
        "trial",
    ],
}
# (transformers class name, method) -> its first parameters, as modeling_vanilla.py overrides or calls it
MODEL_METHODS = {
    ("PreTrainedModel", "_resize_token_embeddings"): ["self", "new_num_tokens", "pad_to_multiple_of", "mean_resizing"],
    ("PreTrainedModel", "_get_resized_embeddings"): ["self", "old_embeddings", "new_num_tokens", "pad_to_multiple_of"],
    ("PreTrainedModel", "_get_resized_lm_head"): ["self", "old_lm_head", "new_num_tokens", "transposed"],
}


def compile_on_every_device(config: CompileConfig) -> CompileConfig:
    """`config`, made to compile `generate()`'s decoding step on the CPU too."""
    config._compile_all_devices = True
    return config
