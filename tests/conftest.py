"""Tiny models built in-process: nothing is downloaded, every test runs in seconds on a CPU."""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla.data import BUNDLED_CORPORA
from hf_vanilla.modeling_vanilla import CACHE_FIELD
from hf_vanilla.text_files import stream_lines
from hf_vanilla.tokenization import train_bpe_tokenizer


PAD, BOS, EOS = 0, 1, 2


def pytest_configure(config):
    """Every test, and every command a test starts, gets a datasets cache (so also a default data cache) of this
    session only: no run reuses the BPE or tokenized files of an earlier session, and the user's cache is untouched."""
    session_cache = tempfile.mkdtemp(prefix="hf-vanilla-tests-")
    config.add_cleanup(lambda: shutil.rmtree(session_cache, ignore_errors=True))
    os.environ["HF_DATASETS_CACHE"] = session_cache


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


def make_config(**overrides) -> VanillaTransformerConfig:
    return VanillaTransformerConfig(**{**TEST_CONFIG, **overrides})


def make_model(seed: int = 0, attn_implementation: str = "eager", **overrides):
    """A randomly initialised tiny model in eval mode (dropout off)."""
    torch.manual_seed(seed)
    config = make_config(**overrides)
    config._attn_implementation = attn_implementation
    return VanillaTransformerForConditionalGeneration(config).eval()


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


@pytest.fixture(scope="session")
def small_tokenizer():
    return train_small_tokenizer()


REVERSAL_VOCAB = 24
_lengths = torch.randint(1, 8, (40,), generator=torch.Generator().manual_seed(1)).tolist()
# Sources for the reversal model (ids without EOS): three by hand, then 40 random lengths 1-7.
REVERSAL_SOURCES = [[5, 9, 13, 7], [20, 4], [6, 6, 11, 18, 22, 10]] + [
    torch.randint(4, REVERSAL_VOCAB, (n,), generator=torch.Generator().manual_seed(i)).tolist()
    for i, n in enumerate(_lengths)
]


def train_reversal_model(annealed: bool):
    """A tiny model trained for 1200 steps to reverse sequences of 2-7 ids at a constant rate, or, `annealed`, of 1-7
    ids with warm-up and annealing; and a word-level tokenizer over its vocabulary. At a constant rate it reverses
    ~75% of random sources, which ones depending on the CPU's arithmetic; annealed, every one we tried (300 random,
    REVERSAL_SOURCES)."""
    from benchmarks.synthetic import word_level_tokenizer

    model = make_model(
        seed=0, vocab_size=REVERSAL_VOCAB, dropout=0.0, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128
    )
    model.train()
    rate, steps = (3e-3 if annealed else 2e-3), 1200
    optimizer = torch.optim.Adam(model.parameters(), lr=rate, betas=(0.9, 0.98), eps=1e-9)
    # (OneCycleLR sets the optimizer's rate as it is built: only the annealed run may build it.)
    schedule = (
        torch.optim.lr_scheduler.OneCycleLR(optimizer, rate, total_steps=steps, pct_start=0.1) if annealed else None
    )
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        lengths = torch.randint(1 if annealed else 2, 8, (32,), generator=generator)
        body = torch.randint(4, REVERSAL_VOCAB, (32, 8), generator=generator)
        source = torch.full((32, 9), 0)
        target = torch.full((32, 9), -100)
        for row, length in enumerate(lengths.tolist()):
            source[row, :length] = body[row, :length]
            source[row, length] = EOS
            target[row, :length] = body[row, :length].flip(0)
            target[row, length] = EOS
        loss = model(input_ids=source, attention_mask=source.ne(0), labels=target).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if schedule is not None:
            schedule.step()
    return model.eval(), word_level_tokenizer(REVERSAL_VOCAB)


@pytest.fixture(scope="session")
def reversal_model():
    """A model that reverses every source: for comparing exports, engines and decoding paths on meaningful output."""
    return train_reversal_model(annealed=True)


@pytest.fixture(scope="session")
def unsure_reversal_model():
    """A model whose outputs are mostly right but not sure of it, so that a length penalty reorders its n-best."""
    return train_reversal_model(annealed=False)


@pytest.fixture(scope="session")
def reversal_exports(reversal_model, tmp_path_factory) -> dict[str, Path]:
    """The reversal model saved with its tokenizer ("pytorch"), and exported by the commands users run ("onnx",
    "ctranslate2", and "openvino" where it is installed; float32)."""
    from hf_vanilla.commands import main

    pytest.importorskip("onnxruntime")
    pytest.importorskip("ctranslate2")
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    model, tokenizer = reversal_model
    folder = tmp_path_factory.mktemp("reversal")
    model.save_pretrained(folder / "pytorch")
    tokenizer.save_pretrained(folder / "pytorch")
    text_tokenizer = AutoTokenizer.from_pretrained(folder / "pytorch")  # reads "t5 t9 </s>" as three tokens
    text_tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    text_tokenizer.save_pretrained(folder / "pytorch")
    engines = ["onnx", "ctranslate2"] + (["openvino"] if importlib.util.find_spec("openvino") else [])
    for engine in engines:
        main(["export", engine, str(folder / "pytorch"), str(folder / engine)])
    return {engine: folder / engine for engine in ("pytorch", *engines)}


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
