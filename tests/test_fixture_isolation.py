"""Fixtures built once for many tests hand each test its own copy (`conftest.own`): what one test does to a
tokenizer, a model or a folder is never seen by another, whatever the order and the worker."""

import torch


def test_a_tokenizer_a_test_pads_with_leaves_the_shared_one_unpadded(small_tokenizer, trained_small_tokenizer):
    small_tokenizer(["A dog.", "Two dogs run in the snow."], padding=True, truncation=True, max_length=4)
    assert small_tokenizer.backend_tokenizer.padding is not None
    assert small_tokenizer.backend_tokenizer.truncation is not None
    assert trained_small_tokenizer.backend_tokenizer.padding is None
    assert trained_small_tokenizer.backend_tokenizer.truncation is None


def test_a_model_a_test_changes_leaves_the_shared_one_as_it_was(reversal_model, loaded_reversal_model):
    (model, _), (shared, _) = reversal_model, loaded_reversal_model
    before = {name: weight.clone() for name, weight in shared.state_dict().items()}
    model.train()
    model.generation_config.num_beams = 7
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(1.0)
    assert not shared.training and shared.generation_config.num_beams != 7
    assert all(torch.equal(weight, before[name]) for name, weight in shared.state_dict().items())


def test_a_folder_a_test_writes_into_leaves_the_shared_one_as_it_was(own, tmp_path_factory):
    shared = tmp_path_factory.mktemp("shared")
    (shared / "model.txt").write_text("built once")
    mine = own(shared)
    (mine / "model.txt").write_text("changed")
    (mine / "extra.txt").write_text("added")
    assert mine != shared and (shared / "model.txt").read_text() == "built once"
    assert sorted(path.name for path in shared.iterdir()) == ["model.txt"]
