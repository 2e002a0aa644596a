"""Safety rules, checked on the source: safetensors only, no unsafe deserialisation, self-contained remote code."""

import ast
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    [
        *ROOT.joinpath("hf_vanilla").rglob("*.py"),
        *ROOT.joinpath("scripts").glob("*.py"),
        *ROOT.joinpath("benchmarks").glob("*.py"),
    ]
)
REMOTE_CODE = ("configuration_vanilla.py", "modeling_vanilla.py", "pipeline_vanilla.py")


def calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_unsafe_loading_or_evaluation(path):
    tree = ast.parse(path.read_text())
    for node, name in calls(tree):
        assert name not in ("eval", "exec", "compile"), f"{path.name}:{node.lineno} calls {name}"
        if name == "torch.load":
            weights_only = {kw.arg: kw.value for kw in node.keywords}.get("weights_only")
            assert isinstance(weights_only, ast.Constant) and weights_only.value is True, (
                f"{path.name}:{node.lineno}: torch.load without weights_only=True"
            )
        assert not name.endswith((".save_pretrained",)) or not any(
            kw.arg == "safe_serialization" and isinstance(kw.value, ast.Constant) and kw.value.value is False
            for kw in node.keywords
        ), f"{path.name}:{node.lineno} saves without safetensors"
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [alias.name for alias in node.names] + [getattr(node, "module", None) or ""]
            assert not any(n.split(".")[0] in ("pickle", "dill", "marshal", "shelve") for n in names), (
                f"{path.name}:{node.lineno} imports a pickle-like module"
            )


@pytest.mark.parametrize("name", REMOTE_CODE)
def test_remote_code_files_import_only_torch_transformers_and_each_other(name):
    tree = ast.parse((ROOT / "hf_vanilla" / name).read_text())
    siblings = {file.removesuffix(".py") for file in REMOTE_CODE}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert node.level == 1 and node.module in siblings, (name, node.module)
                continue
            roots = {node.module.split(".")[0]}
        else:
            continue
        # huggingface_hub and packaging: transformers' own dependencies (the config's `@strict`, its version check)
        standard_library = {"math", "collections", "dataclasses", "functools", "inspect", "re"}
        assert roots <= standard_library | {"torch", "transformers", "huggingface_hub", "packaging"}, (
            name,
            roots,
        )
