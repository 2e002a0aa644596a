"""What the benchmark measures: a random MarianMT model and ours converted from it (the same function), synthetic
id batches, and the generation and training workloads run on both."""

import torch
from tokenizers import Tokenizer, models
from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast

from hf_vanilla.interop.marian import convert_marian
from hf_vanilla.tokenization import SPECIAL_TOKENS


PRESETS = {
    "small": dict(d_model=256, layers=3, heads=4, ffn=1024, vocab=8000),
    "base": dict(d_model=512, layers=6, heads=8, ffn=2048, vocab=32000),
}


def build_models(preset: str | dict, device: str, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.nn.Module]:
    """{"ours": ..., "marian": ...}: a random MarianMT model and ours converted from it, in eval mode. `preset` is a
    name in `PRESETS` or a shape of the same keys (and optionally `dropout`, 0.1 if absent)."""
    shape = PRESETS[preset] if isinstance(preset, str) else preset
    config = MarianConfig(
        vocab_size=shape["vocab"],
        d_model=shape["d_model"],
        encoder_layers=shape["layers"],
        decoder_layers=shape["layers"],
        encoder_attention_heads=shape["heads"],
        decoder_attention_heads=shape["heads"],
        encoder_ffn_dim=shape["ffn"],
        decoder_ffn_dim=shape["ffn"],
        activation_function="relu",
        scale_embedding=True,
        max_position_embeddings=1024,
        pad_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=1,
        dropout=shape.get("dropout", 0.1),
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    marian = MarianMTModel(config)
    ours = convert_marian(marian)
    return {"ours": ours.to(device, dtype).eval(), "marian": marian.to(device, dtype).eval()}


def source_batch(batch: int, length: int, vocab: int, device: str, mixed: bool = False, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    if mixed:  # lengths spread from 8 to `length`, right-padded
        for row, n in enumerate(torch.linspace(8, length, batch).round().long().tolist()):
            ids[row, n:] = 0
            mask[row, n:] = 0
    ids[torch.arange(batch), mask.sum(1) - 1] = 2  # each source ends in EOS
    return ids.to(device), mask.to(device)


def generation_runs(models, inputs, new_tokens: int, num_beams: int, use_cache: bool = True, **generate_kwargs):
    ids, mask = inputs
    kwargs = dict(
        input_ids=ids,
        attention_mask=mask,
        min_new_tokens=new_tokens,
        max_new_tokens=new_tokens,
        num_beams=num_beams,
        do_sample=False,
        length_penalty=1.0,
        use_cache=use_cache,
        **generate_kwargs,
    )

    def run(model):
        with torch.inference_mode():
            return model.generate(**kwargs)

    return {name: (lambda m=model: run(m)) for name, model in models.items()}


def training_runs(models, batch: int, source_length: int, target_length: int, vocab: int, device: str):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(4, vocab, (batch, source_length), generator=generator).to(device)
    labels = torch.randint(4, vocab, (batch, target_length), generator=generator).to(device)
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in models.items()}

    def step(name):
        model = models[name]
        model.train()
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
        loss.backward()
        optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)
        model.eval()

    return {name: (lambda n=name: step(n)) for name in models}


def word_level_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A tokenizer whose words `t4 ... t{n-1}` are ids 4 ... n-1, for synthetic data that is already token ids
    (CTranslate2 needs token strings; tests use it for pipelines and trainers of random models). Special tokens as
    in `hf_vanilla.tokenization.SPECIAL_TOKENS`."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS.values())}
    vocab.update({f"t{i}": i for i in range(len(vocab), vocab_size)})
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS["unk_token"])), **SPECIAL_TOKENS
    )
