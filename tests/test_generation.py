"""The KV cache changes speed, never results: cached == uncached, static == dynamic, steps == one forward."""

import logging as std_logging
import sys

import pytest
import torch
from torch._dynamo.utils import counters
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from hf_vanilla.inference import static_cache_and_compile
from hf_vanilla.modeling_vanilla import DEFAULT_MAX_LENGTH
from hf_vanilla.pipeline_vanilla import decoding_max_length

from .conftest import BOS, EOS, PAD, decode_step_by_step, make_model, padded_batch, to_device


GREEDY = dict(num_beams=1, do_sample=False)
BEAM = dict(num_beams=4, num_return_sequences=2, do_sample=False, length_penalty=0.6)
SAMPLE = dict(num_beams=1, do_sample=True, top_k=0, temperature=1.3)


def generate(model, inputs, seed=0, **kwargs):
    torch.manual_seed(seed)
    return model.generate(**inputs, max_new_tokens=12, **kwargs)


@pytest.fixture(params=["eager", "sdpa"])
def model(request):
    # init_std 1.0 and plain Xavier q/k/v make the random model's distributions peaked and varied, so outputs are
    # not one token repeated.
    return make_model(seed=3, attn_implementation=request.param, init_std=1.0, qkv_init_gain=1.0)


@pytest.fixture
def inputs(source_batch):
    input_ids, attention_mask = source_batch
    return dict(input_ids=input_ids, attention_mask=attention_mask)


@pytest.fixture
def placed(model, inputs, device):
    """The model and the inputs on `device`: the decoding invariants hold on every device."""
    return model.to(device), to_device(inputs, device)


@pytest.mark.parametrize("mode", [GREEDY, BEAM, SAMPLE], ids=["greedy", "beam4_nbest2", "sampling"])
def test_cached_equals_uncached(placed, mode):
    model, inputs = placed
    cached = generate(model, inputs, use_cache=True, **mode)
    uncached = generate(model, inputs, use_cache=False, **mode)
    assert cached.shape[0] == inputs["input_ids"].shape[0] * mode.get("num_return_sequences", 1)
    assert torch.equal(cached, uncached)


def test_outputs_are_not_degenerate(placed):
    model, inputs = placed
    # Guards the invariants above against passing trivially on a constant output.
    tokens = generate(model, inputs, **GREEDY)
    assert len(set(tokens[:, 1:].flatten().tolist())) > 3


@pytest.mark.parametrize("mode", [GREEDY, BEAM], ids=["greedy", "beam4_nbest2"])
def test_static_cache_equals_dynamic(placed, mode):
    model, inputs = placed
    dynamic = generate(model, inputs, **mode)
    static = generate(model, inputs, cache_implementation="static", **mode)
    assert torch.equal(dynamic, static)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_step_by_step_equals_one_forward(attn_implementation, source_batch):
    # The paper's init keeps logits O(1), so 1e-5 is float32 rounding, not a loose tolerance.
    model = make_model(seed=3, attn_implementation=attn_implementation)
    input_ids, attention_mask = source_batch
    decoder_input_ids = torch.tensor([[BOS, 7, 8, 9, 10, 11], [BOS, 12, 13, 14, 15, 16], [BOS, 3, 4, 5, 6, 7]])
    with torch.no_grad():
        full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    steps, cache = decode_step_by_step(model, input_ids, attention_mask, decoder_input_ids)
    assert cache.get_seq_length() == decoder_input_ids.shape[1]
    assert (steps - full).abs().max() <= 1e-5


@pytest.mark.parametrize("mode", [GREEDY, dict(num_beams=4, do_sample=False)], ids=["greedy", "beam4"])
def test_padded_batch_equals_one_by_one(placed, mode):
    model, inputs = placed
    batch = generate(model, inputs, **mode)
    for row, (ids, mask) in enumerate(zip(inputs["input_ids"], inputs["attention_mask"], strict=True)):
        single = generate(model, dict(input_ids=ids[mask.bool()][None]), **mode)[0]
        batched = batch[row, : single.shape[0]]
        assert torch.equal(batched, single)
        assert (batch[row, single.shape[0] :] == PAD).all()


def test_padded_source_tokens_change_nothing(model, source_batch):
    input_ids, attention_mask = source_batch
    scrambled = input_ids.masked_fill(attention_mask == 0, 44)
    decoder_input_ids = torch.tensor([[BOS, 7, 8]] * 3)
    with torch.no_grad():
        a = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        b = model(input_ids=scrambled, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    assert torch.equal(a, b)


def test_future_target_tokens_do_not_change_earlier_logits(model, source_batch):
    input_ids, attention_mask = source_batch
    target = torch.tensor([[BOS, 7, 8, 9, 10, 11, 12, 13]] * 3)
    t = 3
    changed = target.clone()
    changed[:, t + 1 :] = torch.tensor([50, 51, 52, 53])
    with torch.no_grad():
        a = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=target).logits
        b = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=changed).logits
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])  # the change is visible where it should be


def test_generation_defaults_follow_the_paper():
    model = make_model()
    assert model.generation_config.num_beams == 4
    assert model.generation_config.length_penalty == 0.6
    assert model.generation_config.decoder_start_token_id == BOS
    assert model.generation_config.eos_token_id == EOS


def test_final_logits_bias_is_added_and_generation_stops_at_eos():
    model = make_model(seed=1, add_final_logits_bias=True)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = 100.0  # EOS always wins
    input_ids, attention_mask = padded_batch([[5, 6, EOS]])
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, **GREEDY)
    assert out.tolist() == [[BOS, EOS]]


def test_long_beam_search_matches_uncached_with_the_cross_attention_cache_left_in_place(placed):
    model, inputs = placed
    long_beam = dict(num_beams=3, do_sample=False, min_new_tokens=60, max_new_tokens=60)
    assert torch.equal(model.generate(**inputs, **long_beam), model.generate(**inputs, **long_beam, use_cache=False))


@pytest.mark.parametrize("mode", [GREEDY, SAMPLE], ids=["greedy", "sampling"])  # beam search never compiles
def test_compiled_static_cache_generation_equals_eager(placed, mode):
    # fullgraph=True fails on any graph break, so this also proves the decoding step traces as one graph (the
    # static cache's length is a tensor: positions and checks must not turn it into a Python number).
    model, inputs = placed
    torch._dynamo.reset()
    counters.clear()
    eager = generate(model, inputs, **mode)
    compiled = generate(model, inputs, **static_cache_and_compile(), **mode)
    assert counters["stats"]["unique_graphs"] >= 1  # the step really ran compiled
    assert torch.equal(eager, compiled)


@pytest.mark.parametrize("position_embedding_type", ["sinusoidal", "learned"])
def test_static_cache_longer_than_the_position_table(position_embedding_type, source_batch):
    model = make_model(
        seed=3, init_std=1.0, position_embedding_type=position_embedding_type, max_position_embeddings=8
    )
    inputs = dict(zip(["input_ids", "attention_mask"], source_batch, strict=True))
    if position_embedding_type == "learned":  # the cache is sized before the first step: refused there
        with pytest.raises(ValueError, match="static cache.*max_position_embeddings"):
            generate(model, inputs, cache_implementation="static", **GREEDY)
        return
    # Sinusoids extrapolate: the table grows to the cache's size, and the result is the dynamic cache's.
    dynamic = generate(model, inputs, **GREEDY)
    assert torch.equal(generate(model, inputs, cache_implementation="static", **GREEDY), dynamic)
    assert model.model.decoder.embed_positions.weight.shape[0] > 8  # grew to the cache, not cut the output


def test_a_bare_generate_is_not_cut_at_twenty_tokens():
    # The library's default max_length is 20; ours is MarianMT's 512, so only EOS or the caller stops a translation.
    model = make_model(add_final_logits_bias=True).eval()
    model.final_logits_bias[0, 7] = 1e4  # token 7 always wins: EOS never comes
    out = model.generate(input_ids=torch.tensor([[5, 6, 7, EOS]]), num_beams=1, do_sample=False)
    assert out.shape == (1, DEFAULT_MAX_LENGTH) and DEFAULT_MAX_LENGTH == 512
    assert model.generation_config.max_length == 512


def test_max_new_tokens_wins_over_the_generation_configs_length_and_our_own_decoding_does_not_warn(small_tokenizer):
    """`max_new_tokens` beside the generation config's `max_length` (512, as MarianMT's) takes precedence, with the
    library's note that both were set; our own callers (pipeline, `translate`, the recipe) pass `max_length`."""
    from hf_vanilla.inference import GenerateTranslator
    from hf_vanilla.pipeline_vanilla import VanillaTranslationPipeline

    model = make_model(add_final_logits_bias=True, vocab_size=len(small_tokenizer)).eval()
    model.final_logits_bias[0, 7] = 1e4  # token 7 always wins: EOS never comes
    source = torch.tensor([[5, 6, 7, EOS]])
    with CaptureLogger(logging.get_logger("transformers.generation.utils")) as captured:
        out = model.generate(input_ids=source, num_beams=1, max_new_tokens=30)
    assert out.shape == (1, 31)  # the start token + 30
    assert "seem to have been set" in captured.out  # the library's own words, as for MarianMT

    with CaptureLogger(logging.get_logger("transformers.generation.utils")) as captured:
        VanillaTranslationPipeline(model=model, tokenizer=small_tokenizer)("A dog runs.", num_beams=1)
        GenerateTranslator(model, small_tokenizer, num_beams=1)([[5, 6, 7, EOS]])
    assert captured.out == ""
    generated = model.generate(input_ids=source, num_beams=1, max_length=decoding_max_length(4))
    assert generated.shape == (1, 1 + 4 + 50)  # the paper's budget: source length + 50 new tokens


HOST_CONVERSIONS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")


def host_syncs_in_our_model(model, inputs, new_tokens: int, monkeypatch, **mode) -> int:
    """How many times the model's own code reads a tensor on the host (each one waits for a GPU) during a
    `generate()` of `new_tokens` tokens."""
    count = 0
    for name in HOST_CONVERSIONS:
        original = getattr(torch.Tensor, name)

        def counting(tensor, *args, __original=original, **kwargs):
            nonlocal count
            count += sys._getframe(1).f_code.co_filename.endswith("modeling_vanilla.py")
            return __original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **mode)
    monkeypatch.undo()
    return count


@pytest.mark.parametrize("mode", [GREEDY, BEAM], ids=["greedy", "beam4"])
def test_no_host_sync_per_decoding_step(placed, monkeypatch, mode):
    model, inputs = placed
    short = host_syncs_in_our_model(model, inputs, 5, monkeypatch, **mode)
    long = host_syncs_in_our_model(model, inputs, 50, monkeypatch, **mode)
    assert 0 < short == long, "the id checks run once per call, at the boundary, not at every step"


def test_bad_ids_still_get_their_clear_error_at_the_boundary(model, inputs):
    with pytest.raises(ValueError, match=r"`input_ids` holds ids in \[2, 61\]"):
        model.generate(input_ids=torch.tensor([[5, 61, EOS]]), max_new_tokens=3)
    with pytest.raises(ValueError, match="`decoder_input_ids` holds ids"):
        model.generate(**inputs, decoder_input_ids=torch.full((3, 1), 99), max_new_tokens=3)


# The cache under the library's names: `cache` from transformers 5.24, `past_key_values` before


@pytest.mark.parametrize("mode", [GREEDY, BEAM, SAMPLE], ids=["greedy", "beam4_nbest2", "sampling"])
def test_generate_feeds_the_decoder_one_new_token_a_step_through_its_cache(model, inputs, mode):
    """What a cache that `generate()` hands over under a name the model does not read looks like: every step feeds
    the decoder the whole prefix again (transformers 5.24 renamed it; the model decoded without its cache)."""
    lengths = []
    hook = model.model.decoder.register_forward_pre_hook(
        lambda module, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        generate(model, inputs, **mode)
    finally:
        hook.remove()
    assert len(lengths) > 3 and lengths[0] == 1 and set(lengths[1:]) == {1}


def test_the_cache_goes_in_under_either_name_and_comes_out_under_the_librarys(model, inputs):
    """The old name, as each release's own models take it: with the library's deprecation warning where the
    installed release names the cache `cache` (5.24's `@deprecate_kwarg` on Marian's forwards), silently before."""
    import warnings

    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    from hf_vanilla.modeling_vanilla import CACHE_FIELD

    decoder_input_ids = torch.tensor([[BOS, 7, 9]] * inputs["input_ids"].shape[0])
    with torch.no_grad():
        full = model(**inputs, decoder_input_ids=decoder_input_ids).logits
        results = []
        for name in ("cache", "past_key_values"):
            cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                first = model(**inputs, decoder_input_ids=decoder_input_ids[:, :2], **{name: cache}, use_cache=True)
            deprecations = [w for w in caught if "`past_key_values` is deprecated" in str(w.message)]
            assert [w.category for w in deprecations] == [FutureWarning] * (
                name == "past_key_values" and CACHE_FIELD == "cache"
            )
            assert getattr(first, CACHE_FIELD) is cache and cache.get_seq_length() == 2
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                results.append(model(**inputs, decoder_input_ids=decoder_input_ids[:, 2:], **{name: cache}).logits)
        with pytest.raises(ValueError, match="`past_key_values` and `cache`|Pass the cache once"):
            model(**inputs, decoder_input_ids=decoder_input_ids, cache=cache, past_key_values=cache)
    assert torch.equal(results[0], results[1])
    torch.testing.assert_close(results[0], full[:, 2:], atol=1e-5, rtol=1e-5)


def generate_under_a_future_release(model, inputs, monkeypatch, change_model_inputs):
    """Greedy tokens when `generate()` hands the forward what `change_model_inputs` makes of the inputs the installed
    release prepares for each step: a simulated later transformers release."""
    from transformers import GenerationMixin

    library_prepare = GenerationMixin.prepare_inputs_for_generation

    def prepare(self, *args, **kwargs):
        model_inputs = library_prepare(self, *args, **kwargs)
        change_model_inputs(model_inputs)
        return model_inputs

    with monkeypatch.context() as patch:
        patch.setattr(GenerationMixin, "prepare_inputs_for_generation", prepare)
        return generate(model, inputs, **GREEDY)


def test_a_cache_under_a_name_the_model_does_not_read_stops_generation_with_the_name(model, inputs, monkeypatch):
    """A future release that renames the cache again (simulated here: `generate()` passes it as `kv_cache`)
    gets an error naming the argument, not a model that decodes without its cache."""

    def rename_the_cache(model_inputs):
        for old in ("cache", "past_key_values"):
            if old in model_inputs:
                model_inputs["kv_cache"] = model_inputs.pop(old)

    with pytest.raises(TypeError, match=r"a cache under a name it does not read: \['kv_cache'\].*hf-vanilla env"):
        generate_under_a_future_release(model, inputs, monkeypatch, rename_the_cache)
    with pytest.raises(TypeError, match=r"VanillaTransformerModel.forward\(\) got a cache .*\['layer_past'\]"):
        model.model(**inputs, decoder_input_ids=torch.tensor([[BOS]] * 3), layer_past=None)


def test_a_keyword_a_later_release_adds_is_ignored_once_with_a_warning(model, inputs, monkeypatch):
    """Published remote code cannot be updated: a harmless argument that a later release passes (simulated here:
    `generate()` adds `future_option`, and `cache_position`, which some releases pass) still translates, the same
    tokens, and is named once in transformers' log."""
    expected = generate(model, inputs, **GREEDY)

    def add_arguments(model_inputs):
        model_inputs.update(future_option=True, cache_position=torch.arange(1))

    std_logging.Logger.warning_once.cache_clear()  # transformers' once-only log: once in this test
    with CaptureLogger(logging.get_logger("hf_vanilla.modeling_vanilla")) as captured:
        tokens = generate_under_a_future_release(model, inputs, monkeypatch, add_arguments)
    assert torch.equal(tokens, expected)
    assert captured.out.count("ignores the keyword arguments ['cache_position', 'future_option']") == 1


@pytest.mark.parametrize("mode", [GREEDY, BEAM, SAMPLE], ids=["greedy", "beam4_nbest2", "sampling"])
def test_our_calls_into_the_library_log_no_deprecation(model, inputs, mode):
    """transformers announces a renamed argument with a logged warning (5.24: "`past_key_values`/`cache_params`
    are deprecated"), not only a Python warning (which the suite turns into errors, see pyproject.toml)."""
    with CaptureLogger(logging.get_logger("transformers")) as captured:
        generate(model, inputs, **mode)
        model(**inputs, decoder_input_ids=torch.tensor([[BOS, 7]] * inputs["input_ids"].shape[0]), use_cache=True)
    assert "deprecated" not in captured.out.lower()
