"""Tiny models built in-process: nothing is downloaded, every test runs in seconds on a CPU."""

import copy
import importlib.util
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla.data import BUNDLED_CORPORA
from hf_vanilla.modeling_vanilla import CACHE_FIELD
from hf_vanilla.text_files import stream_lines
from hf_vanilla.tokenization import train_bpe_tokenizer

from .build_cache import built_once


def free_port() -> int:
    """A port nothing listens on now: launches that run side by side (two CI legs, two pytest runs) must not share
    torch.distributed's default 29500, or one's ranks join the other's rendezvous and wait out its timeout."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(processes: int) -> list[str]:
    """The start of a command that launches `processes` processes on this host under torchrun, on a free port."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
            "--master_port", str(free_port())]  # fmt: skip


PAD, BOS, EOS = 0, 1, 2

# The devices a test that takes `device` runs on: the CPU everywhere, CUDA where a GPU is present (CI has none; the
# GPU run of these tests is recorded in docs/performance.md).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def to_device(tensors: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    """Model inputs by name, each moved to `device`."""
    return {name: tensor.to(device) for name, tensor in tensors.items()}


def pytest_configure(config):
    """Every test, and every command a test starts, gets a datasets cache (so also a default data cache) of this
    session only: no run reuses the BPE or tokenized files of an earlier session, and the user's cache is untouched.

    They also run torch on one thread, unless OMP_NUM_THREADS says otherwise: the test models are tiny, so a second
    thread mostly waits at each operator's barrier, and where another process keeps the other cores busy (CI runs its
    floors and newest legs beside the suite) it waits there for a thread that is not running."""
    session_cache = tempfile.mkdtemp(prefix="hf-vanilla-tests-")
    config.add_cleanup(lambda: shutil.rmtree(session_cache, ignore_errors=True))
    os.environ["HF_DATASETS_CACHE"] = session_cache
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files with `slow` tests (the ones that start processes) first, each file's tests in their own order.

    pytest-xdist hands a free worker the next file in this order (`--dist loadfile --no-loadscope-reorder`): started
    first, the long files end while the many short ones still fill both workers, where xdist's own order (the most
    tests first) left a long file alone at the end, one core idle. A run in random order (pytest-randomly enabled)
    keeps its shuffle whole."""
    if config.pluginmanager.has_plugin("randomly"):
        return
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the rest keep pytest's order


ROOT = Path(__file__).resolve().parents[1]
MULTI30K, _ = BUNDLED_CORPORA["multi30k"]  # shipped with the package: no test skips for lack of data

TEST_CONFIG = dict(
    vocab_size=61,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=37,
    decoder_ffn_dim=37,
    dropout=0.1,
    max_position_embeddings=128,
)


class StopAt(TrainerCallback):
    """Stops training after update `step` with a checkpoint, as a preempted job's SIGTERM does."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = control.should_save = True


def make_config(**overrides) -> VanillaTransformerConfig:
    return VanillaTransformerConfig(**{**TEST_CONFIG, **overrides})


def make_model(seed: int = 0, attn_implementation: str = "eager", **overrides):
    """A randomly initialised tiny model in eval mode (dropout off)."""
    torch.manual_seed(seed)
    config = make_config(**overrides)
    config._attn_implementation = attn_implementation
    return VanillaTransformerForConditionalGeneration(config).eval()


def word_budget_trainer(
    output_dir, max_tokens: int, pairs: int = 64, callbacks=(), trainer_options=None, dropout: float = 0.0, **arguments
):
    """A `TokenBudgetSeq2SeqTrainer` of a tiny model on `pairs` synthetic pairs (2 to 7 tokens and an end of
    sequence), every update logged, no checkpoint but those asked for (`arguments` may set a save strategy): what the
    schedule tests train."""
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

    from benchmarks.synthetic import word_level_tokenizer
    from hf_vanilla.training import TokenBudgetSeq2SeqTrainer

    rows = [[4 + (i + j) % 40 for j in range(2 + i % 6)] + [EOS] for i in range(pairs)]
    lengths = list(map(len, rows))
    data = Dataset.from_dict({"input_ids": rows, "labels": rows, "source_length": lengths, "target_length": lengths})
    torch.manual_seed(0)
    model = make_model(dropout=dropout, vocab_size=48)
    settings = {"use_cpu": True, "report_to": [], "logging_steps": 1, "save_strategy": "no", "disable_tqdm": True}
    args = Seq2SeqTrainingArguments(output_dir=str(output_dir), seed=3, **{**settings, **arguments})
    return TokenBudgetSeq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=DataCollatorForSeq2Seq(word_level_tokenizer(48), model=model),
        max_tokens=max_tokens,
        callbacks=list(callbacks),
        **(trainer_options or {}),
    )


def padded_batch(rows: list[list[int]], pad: int = PAD) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into (input_ids, attention_mask)."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def decode_step_by_step(model, input_ids, attention_mask, decoder_input_ids):
    """Logits [B, T, V] from feeding `decoder_input_ids` one token at a time through a KV cache, and the cache."""
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        steps = []
        for t in range(decoder_input_ids.shape[1]):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=attention_mask,
                decoder_input_ids=decoder_input_ids[:, t : t + 1],
                cache=cache,
                use_cache=True,
            )
            cache = getattr(out, CACHE_FIELD)
            steps.append(out.logits)
    return torch.cat(steps, dim=1), cache


@pytest.fixture
def source_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three sources of different lengths, each ending in EOS, right-padded."""
    return padded_batch([[5, 9, 14, 22, 7, 31, EOS], [40, 12, EOS], [18, 3, 27, 55, EOS]])


def train_small_tokenizer():
    """A 400-entry BPE over the first 2000 Multi30k pairs: enough for pipeline tests, trained in a second."""
    lines = list(stream_lines(MULTI30K / "train.en.gz"))[:2000] + list(stream_lines(MULTI30K / "train.de.gz"))[:2000]
    return train_bpe_tokenizer(lines, vocab_size=400, show_progress=False)


@pytest.fixture
def own(tmp_path_factory) -> Callable:
    """`own(value)`: this test's own copy of what a fixture of a wider scope built once, so that no test sees what
    another did to it (a tokenizer keeps the padding of its last call, a model its mode and generation config, a folder
    what was written into it): a folder (`Path`) is copied into a temporary folder of its own (the test's `tmp_path`
    stays empty), tuples, lists and dicts item by item, anything else deep-copied."""

    def copy_of(value):
        if isinstance(value, Path) and value.is_dir():
            return Path(shutil.copytree(value, tmp_path_factory.mktemp("own") / value.name))
        if isinstance(value, (tuple, list)):
            return type(value)(map(copy_of, value))
        if isinstance(value, dict):
            return {key: copy_of(item) for key, item in value.items()}
        return copy.deepcopy(value)

    return copy_of


@pytest.fixture(scope="session")
def trained_small_tokenizer():
    """Built once a session, for fixtures of a wider scope to save; tests take `small_tokenizer`, their own copy."""
    return train_small_tokenizer()


@pytest.fixture
def small_tokenizer(trained_small_tokenizer, own):
    return own(trained_small_tokenizer)


REVERSAL_VOCAB = 24
_lengths = torch.randint(1, 8, (40,), generator=torch.Generator().manual_seed(1)).tolist()
# Sources for the reversal model (ids without EOS): three by hand, then 40 random lengths 1-7.
REVERSAL_SOURCES = [[5, 9, 13, 7], [20, 4], [6, 6, 11, 18, 22, 10]] + [
    torch.randint(4, REVERSAL_VOCAB, (n,), generator=torch.Generator().manual_seed(i)).tolist()
    for i, n in enumerate(_lengths)
]


def reversal_batch(generator: torch.Generator, rows: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sources of 1-7 ids ending in EOS, right-padded to 9, and their reversals (labels, -100 padded)."""
    lengths = torch.randint(1, 8, (rows,), generator=generator)
    body = torch.randint(4, REVERSAL_VOCAB, (rows, 8), generator=generator)
    source = torch.full((rows, 9), PAD)
    target = torch.full((rows, 9), -100)
    for row, length in enumerate(lengths.tolist()):
        source[row, :length] = body[row, :length]
        source[row, length] = EOS
        target[row, :length] = body[row, :length].flip(0)
        target[row, length] = EOS
    return source, target


def unreversed_sources(model, sources: list[list[int]]) -> int:
    """How many of `sources` the model's greedy and beam-4 translations fail to reverse: one padded batch per decoding
    (a batch decodes as its rows one by one: `test_properties.py`), each row read up to its first EOS."""
    input_ids, attention_mask = padded_batch([ids + [EOS] for ids in sources])
    wrong = 0
    for num_beams in (1, 4):
        out = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=10, do_sample=False
        )
        for ids, row in zip(sources, out[:, 1:].tolist(), strict=True):
            wrong += row[: row.index(EOS) + 1 if EOS in row else None] != ids[::-1] + [EOS]
    return wrong


def train_reversal_model():
    """A tiny model trained to reverse sequences of 1-7 ids, and a word-level tokenizer over its vocabulary.

    Each round is 600 Adam steps with warm-up and annealing; rounds go on until greedy and beam search reverse every
    source the tests use and 300 random ones. How far a round gets depends on the CPU's arithmetic (one round reversed
    all of them on the machines we tried), so the property is checked here, before any test relies on it, and a
    model without it fails the fixture with the count."""
    from benchmarks.synthetic import word_level_tokenizer

    model = make_model(
        seed=0, vocab_size=REVERSAL_VOCAB, dropout=0.0, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128
    )
    check = torch.Generator().manual_seed(12345)
    sources = REVERSAL_SOURCES + [
        torch.randint(4, REVERSAL_VOCAB, (int(n),), generator=check).tolist()
        for n in torch.randint(1, 8, (300,), generator=check)
    ]
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 3e-3, total_steps=600, pct_start=0.1)
        for _ in range(600):
            source, target = reversal_batch(generator)
            loss = model(input_ids=source, attention_mask=source.ne(PAD), labels=target).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        model.eval()
        wrong = unreversed_sources(model, sources)
        if wrong == 0:
            return model, word_level_tokenizer(REVERSAL_VOCAB)
    raise AssertionError(f"the reversal model still fails {wrong} of {2 * len(sources)} decodings after 3 rounds")


def save_reversal_model(folder: Path) -> None:
    model, _ = train_reversal_model()
    model.save_pretrained(folder)


@pytest.fixture(scope="session")
def reversal_model_folder(request, tmp_path_factory) -> Path:
    """The reversal model, trained once and saved, in the build cache."""
    return built_once(request.config, tmp_path_factory, "reversal-model", save_reversal_model)


@pytest.fixture(scope="session")
def loaded_reversal_model(reversal_model_folder):
    from benchmarks.synthetic import word_level_tokenizer

    model = VanillaTransformerForConditionalGeneration.from_pretrained(
        reversal_model_folder, attn_implementation="eager"
    )
    return model.eval(), word_level_tokenizer(REVERSAL_VOCAB)


@pytest.fixture
def reversal_model(loaded_reversal_model, own):
    """A model that reverses every source: for comparing exports, engines and decoding paths on meaningful output."""
    return own(loaded_reversal_model)


def unsure_model():
    """A model unsure of every token by construction, and the reversal tokenizer: an untrained model whose output
    layer is scaled down to near-uniform logits, EOS made about 3 times as likely as any other token. A candidate of
    k tokens then has a log-probability near -k ln(V), whatever the CPU's rounding; EOS is among the beam's best
    continuations from the first step, so a length penalty of -2 (multiplying by k**2) keeps the shortest finished
    candidates and +2 (dividing by it) the longest. Checked before use: at every step of a beam search over the test
    sources each token's probability lies within a factor 2 of uniform, EOS's within 1.5 to 6 times it."""
    from benchmarks.synthetic import word_level_tokenizer

    model = make_model(
        seed=0, vocab_size=REVERSAL_VOCAB, dropout=0.0, tie_word_embeddings=False, add_final_logits_bias=True
    )
    with torch.no_grad():
        model.lm_head.weight.mul_(0.2)  # logits' spread 0.1 here: near uniform, yet no two candidates tie
        model.final_logits_bias[0, EOS] = math.log(3.0)
    for ids in REVERSAL_SOURCES:
        out = model.generate(input_ids=torch.tensor([ids + [EOS]]), num_beams=4, max_new_tokens=12,
                             output_logits=True, return_dict_in_generate=True)  # fmt: skip
        relative = torch.cat(out.logits).float().softmax(-1) * (REVERSAL_VOCAB + 2)  # to uniform, EOS counted thrice
        others = torch.cat([relative[:, :EOS], relative[:, EOS + 1 :]], dim=1)
        assert 0.5 < others.min() and others.max() < 2.0, "the unsure model is sure of some token"
        assert 1.5 < relative[:, EOS].min() and relative[:, EOS].max() < 6.0, "EOS is not about 3 times as likely"
    return model, word_level_tokenizer(REVERSAL_VOCAB)


@pytest.fixture(scope="session")
def built_unsure_model():
    return unsure_model()


@pytest.fixture
def unsure_reversal_model(built_unsure_model, own):
    """A model whose every token is uncertain, so that a length penalty reorders its n-best."""
    return own(built_unsure_model)


def export_reversal_model(model_folder: Path) -> Callable[[Path], None]:
    """A build of the reversal model saved with its tokenizer ("pytorch") and exported by the commands users run
    ("onnx", "ctranslate2", and "openvino" where it is installed; float32), each in a folder of its own."""

    def build(folder: Path) -> None:
        from tokenizers import pre_tokenizers
        from transformers import AutoTokenizer

        from benchmarks.synthetic import word_level_tokenizer
        from hf_vanilla.commands import main

        shutil.copytree(model_folder, folder / "pytorch")
        word_level_tokenizer(REVERSAL_VOCAB).save_pretrained(folder / "pytorch")
        text_tokenizer = AutoTokenizer.from_pretrained(folder / "pytorch")  # reads "t5 t9 </s>" as three tokens
        text_tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        text_tokenizer.save_pretrained(folder / "pytorch")
        for engine in EXPORT_ENGINES:
            main(["export", engine, str(folder / "pytorch"), str(folder / engine)])

    return build


EXPORT_ENGINES = ["onnx", "ctranslate2"] + (["openvino"] if importlib.util.find_spec("openvino") else [])


@pytest.fixture(scope="session")
def built_reversal_exports(request, reversal_model_folder, tmp_path_factory) -> Path:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("ctranslate2")
    return built_once(
        request.config, tmp_path_factory, "reversal-exports", export_reversal_model(reversal_model_folder)
    )


@pytest.fixture
def reversal_exports(built_reversal_exports, own) -> dict[str, Path]:
    """The reversal model's folders by engine: "pytorch" (the model and its tokenizer), and its exports, copied for
    the test alone, so that one that writes into one changes nothing another test or a later run reads."""
    return {engine: own(built_reversal_exports / engine) for engine in ("pytorch", *EXPORT_ENGINES)}


# Translates with a saved folder through remote code only: argv folder, JSON list of sources and optionally the task
# name (default "translation"); prints JSON.
REMOTE_PIPELINE = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_vanilla"] = None  # hf_vanilla cannot be imported here
    from transformers import pipeline
    folder, sources = sys.argv[1], json.loads(sys.argv[2])
    task = sys.argv[3] if len(sys.argv) > 3 else "translation"
    translator = pipeline(task, model=folder, trust_remote_code=True, model_kwargs={"attn_implementation": "eager"})
    assert type(translator).__module__.startswith("transformers_modules"), type(translator).__module__
    outputs = translator(sources, num_beams=1, max_new_tokens=15, batch_size=2)
    print(json.dumps([o["translation_text"] for o in outputs]))
    """
)


def run_without_hf_vanilla(script: str, args: list[str], workdir: Path) -> str:
    """Run `script` in a fresh Python where `import hf_vanilla` fails, offline, with an empty modules cache.

    The script must start with `sys.modules["hf_vanilla"] = None`. Returns its stdout; fails the test on error.
    """
    assert 'sys.modules["hf_vanilla"] = None' in script
    env = {**os.environ, "HF_HOME": str(workdir / "hf_home"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout
