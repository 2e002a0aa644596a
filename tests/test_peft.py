"""LoRA through peft, as users fine-tune: adapters on the attention projections, trained by `Seq2SeqTrainer`, saved
alone, loaded onto the base model, and merged into it with the adapter's outputs."""

import pytest
import torch
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

from hf_vanilla import VanillaTransformerForConditionalGeneration

from .conftest import REVERSAL_VOCAB, make_model, padded_batch, reversal_batch


peft = pytest.importorskip("peft")


def reversal_pairs(rows: int) -> Dataset:
    """The reversal task's pairs as a user's dataset: unpadded `input_ids` and `labels`."""
    source, target = reversal_batch(torch.Generator().manual_seed(3), rows=rows)
    return Dataset.from_dict(
        {
            "input_ids": [row[row.ne(0)].tolist() for row in source],
            "labels": [row[row.ne(-100)].tolist() for row in target],
        }
    )


def logits(model, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    input_ids, attention_mask = batch
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids).logits


# peft 0.21.2 asks transformers for `is_gradient_checkpointing`, which transformers 5.24 deprecates: their call,
# not ours, so it does not fail the test as our own deprecated calls do (pyproject.toml's filterwarnings).
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_on_the_attention_projections_trains_saves_the_adapter_alone_reloads_and_merges(tmp_path):
    from benchmarks.synthetic import word_level_tokenizer

    make_model(seed=0, vocab_size=REVERSAL_VOCAB, dropout=0.0).save_pretrained(tmp_path / "base")
    base = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path / "base")
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(base, lora)
    trained = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert trained and all("lora_" in name and (".q_proj." in name or ".v_proj." in name) for name in trained)

    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=80, learning_rate=3e-2, per_device_train_batch_size=16,
        logging_steps=10, save_strategy="no", use_cpu=True, report_to=[], disable_tqdm=True,
    )  # fmt: skip
    collator = DataCollatorForSeq2Seq(word_level_tokenizer(REVERSAL_VOCAB), model=model)
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=reversal_pairs(256), data_collator=collator)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < 0.8 * losses[0], losses

    model.save_pretrained(tmp_path / "adapter")
    saved = {path.name for path in (tmp_path / "adapter").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json"} <= saved and "model.safetensors" not in saved
    base_size = (tmp_path / "base" / "model.safetensors").stat().st_size
    assert (tmp_path / "adapter" / "adapter_model.safetensors").stat().st_size < base_size / 5

    batch = padded_batch([[5, 9, 13, 7, 2], [20, 4, 2]])
    model.eval()
    expected = logits(model, batch)
    untouched = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path / "base").eval()
    assert not torch.allclose(logits(untouched, batch), expected, atol=1e-3), "the adapter changed nothing"
    reloaded = peft.PeftModel.from_pretrained(untouched, tmp_path / "adapter").eval()
    torch.testing.assert_close(logits(reloaded, batch), expected, rtol=0, atol=0)
    merged = reloaded.merge_and_unload()
    assert type(merged) is VanillaTransformerForConditionalGeneration
    torch.testing.assert_close(logits(merged, batch), expected, rtol=1e-5, atol=1e-5)
    input_ids, attention_mask = batch
    generated = [
        candidate.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=8)
        for candidate in (model, merged)
    ]
    assert torch.equal(*generated)
