"""The house rules of the layout: layers import only downwards, every subcommand has its module, the wheel carries
the library (with its card template and corpora) and not the lab."""

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hf_vanilla.commands import COMMANDS, build_parser


ROOT = Path(__file__).resolve().parents[1]
REMOTE_CODE = {"hf_vanilla.configuration_vanilla", "hf_vanilla.modeling_vanilla", "hf_vanilla.pipeline_vanilla"}


def layer(module: str) -> int:
    """0: the remote-code trio; 1: the library; 2: the training recipe; 3: the commands; 4: the benchmark (lab)."""
    if module in REMOTE_CODE:
        return 0
    if module.startswith("hf_vanilla.training"):
        return 2
    if module.startswith("hf_vanilla.commands") or module == "hf_vanilla.__main__":
        return 3
    if module.startswith("benchmarks"):
        return 4
    return 1


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every project module `path` imports (relative imports resolved), at any depth of the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                found.add(target)
                if not node.module:  # `from . import x`
                    found.update(f"{base}.{alias.name}" for alias in node.names)
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {module for module in found if module.split(".")[0] in ("hf_vanilla", "benchmarks", "tests")}


SOURCES = sorted([*ROOT.joinpath("hf_vanilla").rglob("*.py"), *ROOT.joinpath("benchmarks").glob("*.py")])


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_layer_above_its_own(path):
    own = layer(module_name(path))
    for imported in imported_modules(path):
        assert not imported.startswith("tests"), f"{path.name} imports test code ({imported})"
        assert layer(imported) <= own, (
            f"{module_name(path)} (layer {own}) imports {imported} (layer {layer(imported)})"
        )


def test_every_subcommand_is_one_module_named_after_it():
    modules = {path.stem for path in ROOT.joinpath("hf_vanilla", "commands").glob("*.py")} - {"__init__"}
    assert modules == set(COMMANDS)
    subcommands = next(action for action in build_parser()._actions if action.dest == "command")
    assert set(subcommands.choices) == set(COMMANDS)
    for name, parser in subcommands.choices.items():
        assert parser.get_default("run").__module__ == f"hf_vanilla.commands.{name}"


@pytest.mark.slow
def test_the_wheel_carries_the_library_card_template_and_corpora_but_not_the_lab(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("hf_vanilla-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hf_vanilla/model_card.md" in names and "hf_vanilla/modeling_vanilla.py" in names
    assert "hf_vanilla/corpora/multi30k/README.md" in names
    assert {
        f"hf_vanilla/corpora/multi30k/{split}.{lang}.gz"
        for split in ("train", "val", "test2016")
        for lang in "en de".split()
    } <= set(names)
    assert not [name for name in names if name.startswith(("benchmarks/", "tests/", "scripts/"))]
    assert not [name for name in names if name.endswith("model_card.md") and name != "hf_vanilla/model_card.md"]

    # Installed from the wheel and used outside the checkout: the card template and the data come with it.
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    script = (
        "import hf_vanilla.hub, hf_vanilla.data;"
        "print(hf_vanilla.hub.default_card_template());"
        "c = hf_vanilla.data.load_parallel_corpus('multi30k', 'en', 'de');"
        "print(len(c['train']), len(c['validation']), len(c['test']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    template, sizes = result.stdout.splitlines()[-2:]
    assert Path(template) == site / "hf_vanilla" / "model_card.md"
    assert sizes == "29000 1014 1000"


# The data path's own code, bounded, so that what `datasets`, `filelock` and `tokenizers` already do stays theirs.
DATA_PATH = ["data.py", "text_files.py", "training/preprocessing.py", "training/cache_entries.py", "tokenization.py"]
DATA_PATH_LINES = 800
WORD_CACHE_START = "# The pattern that"  # tokenization.py's word cache, from here on, is counted apart


def test_the_data_path_stays_within_its_bound_of_lines():
    lines = 0
    for name in DATA_PATH:
        text = (ROOT / "hf_vanilla" / name).read_text()
        lines += sum(1 for line in text.split(WORD_CACHE_START)[0].splitlines() if line.strip())
    assert lines <= DATA_PATH_LINES, f"the data path has {lines} non-blank lines, over its {DATA_PATH_LINES}"
