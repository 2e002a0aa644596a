"""The command line of a training run: a YAML recipe with overrides, the bf16 option in every spelling, and when the
train command starts processes itself."""

from pathlib import Path

import pytest
import torch
from transformers import Seq2SeqTrainingArguments

from hf_vanilla.training import parse_arguments
from hf_vanilla.training.budget import budget_decay_share


def test_yaml_recipe_with_command_line_overrides(tmp_path):
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text("max_tokens: 2048\nlearning_rate: 0.005\nwarmup_steps: 2000\noutput_dir: out\n")
    recipe, args = parse_arguments(["--config", str(recipe_file), "--max_tokens", "512", "--seed", "7"])
    assert recipe.max_tokens == 512 and args.seed == 7
    assert args.learning_rate == 0.005 and args.warmup_steps == 2000
    recipe_file.write_text("max_tokenz: 1\n")
    with pytest.raises(ValueError, match="unknown keys"):
        parse_arguments(["--config", str(recipe_file)])


def test_the_published_recipe_is_wu_et_als_command_with_the_forks_fairseq_defaults(monkeypatch):
    """configs/multi30k_wu2021.yaml against README-baseline.md's command and evaluate.sh (LividWo/Revisit-MMT), written
    out here by hand: 2 GPUs x --max-tokens 4096, --lr 0.005, --warmup-updates 2000, --max-update 8000, --patience 10,
    no label smoothing, the fork's Adam (0.9, 0.98) and eps 1e-8, --clip-norm 25; the last 10 epochs averaged,
    beam 5, length penalty 1, BLEU on the tokenised files."""
    monkeypatch.chdir(Path(__file__).parents[1])
    recipe, args = parse_arguments(["--config", "configs/multi30k_wu2021.yaml"])
    assert recipe.data == "multi30k-tok" and recipe.bleu_tokenize == "none"
    assert recipe.max_tokens * args.gradient_accumulation_steps == 2 * 4096
    assert (args.learning_rate, args.warmup_steps, args.max_steps) == (0.005, 2000, 8000)
    assert args.lr_scheduler_type == "inverse_sqrt" and args.label_smoothing_factor == 0.0
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon, args.weight_decay) == (0.9, 0.98, 1e-8, 0.0)
    assert args.max_grad_norm == 25.0
    assert args.eval_strategy == args.save_strategy == "epoch" and recipe.early_stopping_patience == 10
    assert args.metric_for_best_model == "loss" and not args.greater_is_better
    assert recipe.average_last == 10 and recipe.final_weights == "averaged"
    assert (recipe.test_num_beams, recipe.test_length_penalty) == (5, 1.0)


@pytest.mark.parametrize("hardware", ["a CPU with AVX512-BF16", None])
def test_bf16_auto_asks_for_bf16_where_the_hardware_computes_it(tmp_path, monkeypatch, caplog, hardware):
    from hf_vanilla.training import arguments

    monkeypatch.setattr(arguments, "bf16_hardware", lambda: hardware)
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text("bf16: auto\nuse_cpu: true\n")
    with caplog.at_level("WARNING"):
        _, from_recipe = parse_arguments(["--config", str(recipe_file), "--output_dir", str(tmp_path)])
        _, from_option = parse_arguments(["--bf16", "auto", "--use_cpu", "true", "--output_dir", str(tmp_path)])
    assert from_recipe.bf16 is from_option.bf16 is (hardware is not None)
    assert f"bf16: auto -> {hardware is not None}" in caplog.text


def test_the_readme_line_parses_with_nothing_after_the_recipe(monkeypatch):
    """`hf-vanilla train --config configs/quickstart.yaml`, the README's main job, with no further option (it once
    stopped in the option parsing: "zip() argument 2 is shorter than argument 1")."""
    monkeypatch.chdir(Path(__file__).parents[1])
    recipe, args = parse_arguments(["--config", "configs/quickstart.yaml"])
    assert recipe.max_train_minutes == 10 and args.output_dir == "runs/quickstart" and args.bf16 is False
    assert budget_decay_share(args) > 0, "the YAML's lr_scheduler_kwargs reach the budget schedule"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--bf16", "auto"], True),
        (["--bf16=auto"], True),
        (["--bf16"], True),
        (["--bf16", "false"], False),
        (["--bf16=no"], False),
        (["--config", "RECIPE"], True),  # `bf16: auto` in the recipe
        (["--config", "RECIPE", "--bf16", "false"], False),  # the command line wins over the recipe
        (["--bf16=false", "--config", "RECIPE"], False),
    ],
)
def test_every_spelling_of_the_bf16_option_is_read_by_the_parser(tmp_path, monkeypatch, argv, expected):
    from hf_vanilla.training import arguments

    monkeypatch.setattr(arguments, "bf16_hardware", lambda: "a CPU with AMX")
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text("bf16: auto\nuse_cpu: true\n")
    argv = [str(recipe_file) if value == "RECIPE" else value for value in argv]
    _, args = parse_arguments([*argv, "--use_cpu", "true", "--output_dir", str(tmp_path)])
    assert args.bf16 is expected


def test_a_bf16_value_that_is_neither_a_boolean_nor_auto_is_refused_naming_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_arguments(["--bf16", "sometimes", "--output_dir", str(tmp_path)])
    assert "--bf16 takes true, false or auto, got 'sometimes'" in capsys.readouterr().err


@pytest.mark.parametrize("bf16", ["true", "auto"])
def test_bf16_on_a_host_without_an_accelerator_needs_no_use_cpu(tmp_path, monkeypatch, bf16):
    """transformers refuses bf16 on a CPU-only host unless `use_cpu` is set ("Your setup doesn't support bf16/gpu"),
    which a user of `bf16: auto` would meet on the very CPUs it picks; our command sets `use_cpu` where there is no
    accelerator (the device is the CPU either way)."""
    from hf_vanilla.training import arguments

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.setattr(arguments, "bf16_hardware", lambda: "a CPU with AVX512-BF16")
    _, args = parse_arguments(["--bf16", bf16, "--output_dir", str(tmp_path)])
    assert args.bf16 is True and args.use_cpu is True and args.device.type == "cpu"
    if not torch.cuda.is_available():  # what the library alone says here, so the default above matters
        with pytest.raises(ValueError, match="use_cpu"):
            Seq2SeqTrainingArguments(output_dir=str(tmp_path), bf16=True, use_cpu=False)


def test_base_size_models_trained_in_float32_on_bf16_hardware_get_one_line(tmp_path, monkeypatch, caplog):
    from hf_vanilla import VanillaTransformerConfig
    from hf_vanilla.training import recipe

    monkeypatch.setattr(recipe, "bf16_hardware", lambda: "a CPU with AMX")
    _, args = parse_arguments(["--use_cpu", "true", "--output_dir", str(tmp_path)])
    with caplog.at_level("WARNING"):
        recipe.suggest_bf16(args, VanillaTransformerConfig(d_model=512))
        recipe.suggest_bf16(
            args, VanillaTransformerConfig(d_model=128, encoder_attention_heads=4, decoder_attention_heads=4)
        )
    assert caplog.text.count("--bf16 true") == 1 and "512 wide" in caplog.text


def test_the_train_command_starts_itself_only_without_a_launcher_and_never_past_the_cores(monkeypatch):
    from hf_vanilla.training import launcher

    for variable in ("WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(launcher, "usable_cores", lambda: 3)
    monkeypatch.setattr(launcher.torch.accelerator, "is_available", lambda: False)
    assert [launcher.processes_to_launch(n) for n in (1, 2, 8)] == [1, 2, 3]
    monkeypatch.setenv("LOCAL_RANK", "0")  # a launcher started this process: it decided how many
    assert launcher.processes_to_launch(2) == 1
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setattr(launcher.torch.accelerator, "is_available", lambda: True)
    assert launcher.processes_to_launch(2) == 1
    with pytest.raises(ValueError, match="--cpu_processes must be at least 1"):
        launcher.processes_to_launch(0)
