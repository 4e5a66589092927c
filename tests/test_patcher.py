"""BlockSparseModelPatcher: rule semantics, the report, every documented error, and tiny Hugging Face models
(Roberta, Llama, GPT-2) built locally from configs: patched outputs equal the masked dense model, "magnitude"
keeps the largest blocks, training lowers the loss, state_dict round trips, 2:4 rules."""

import copy
import re
import warnings

import pytest
import torch
from torch import nn

from pytorch_block_sparse_ng import (BlockSparseLinear, BlockSparseModelPatcher, ModelPatcher, PatchReport,
                                     PseudoBlockSparseLinear, SemiStructuredLinear)

transformers = pytest.importorskip("transformers", reason="the HF model tests need transformers (the 'test' extra)")

FP32 = dict(rtol=1e-4, atol=1e-5)
BLOCK = 16  # small blocks so that the tiny models below have several blocks per layer


# ---------------------------------------------------------------------------------------------------- a plain model
class Net(nn.Module):
    """layer.0 .. layer.11 (64 -> 64), a LayerNorm, a head (64 -> 32) and, last, a layer 64 -> 48."""

    def __init__(self, n_layers: int = 12):
        super().__init__()
        self.layer = nn.ModuleList(nn.Linear(64, 64) for _ in range(n_layers))
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 32)
        self.odd = nn.Linear(64, 48)  # 48 is not a multiple of 32

    def forward(self, x):
        for layer in self.layer:
            x = torch.relu(layer(x))
        x = self.norm(x)
        return torch.cat([self.head(x), self.odd(x)], dim=-1)


def make_net(seed: int = 0, **kwargs) -> Net:
    torch.manual_seed(seed)
    return Net(**kwargs)


def snapshot(model: nn.Module):
    """(module objects by name, copies of the state_dict) to check that a model was left untouched."""
    return ({name: module for name, module in model.named_modules()},
            {k: v.clone() for k, v in model.state_dict().items()})


def assert_untouched(model: nn.Module, before) -> None:
    modules, state = before
    assert {name: module for name, module in model.named_modules()}.keys() == modules.keys()
    for name, module in model.named_modules():
        assert module is modules[name], name
    after = model.state_dict()
    assert after.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(after[key], value), key


# ---------------------------------------------------------------------------------------------------- rules
def test_rule_is_fullmatched_layer_1_does_not_hit_layer_10():
    model = make_net()
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"layer\.1", {"density": 0.5})
    # The predecessor's re.match would also have taken layer.10 and layer.11.
    report = patcher.patch_model(model)
    assert [record.name for record in report] == ["layer.1"]
    assert isinstance(model.layer[1], BlockSparseLinear)
    for i in (0, 10, 11):
        assert type(model.layer[i]) is nn.Linear, i


def test_rule_must_cover_the_whole_name():
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"layer", {"density": 0.5})  # a prefix of every layer.N: matches none of them
    patcher.add_pattern(r"head", {"density": 0.5})
    assert patcher.pattern_match("layer.3") == (False, None, None)
    assert patcher.pattern_match("head") == (True, "head", {"density": 0.5})
    assert patcher.pattern_match("my_head") == (False, None, None)


def test_first_rule_wins():
    model = make_net()
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"layer\.1", {"density": 0.25})
    patcher.add_pattern(r"layer\.[0-9]+", {"density": 0.75})
    report = patcher.patch_model(model)
    assert len(report) == 12
    by_name = {record.name: record for record in report}
    assert by_name["layer.1"].pattern == r"layer\.1"
    assert model.layer[1].weight.nnz_blocks == 1  # 0.25 of the 2x2 grid of (32, 32) blocks
    for i in (0, 2, 10, 11):
        assert by_name[f"layer.{i}"].pattern == r"layer\.[0-9]+"
        assert model.layer[i].weight.nnz_blocks == 3


def test_patch_info_none_leaves_a_layer_alone():
    model = make_net()
    kept = model.layer[3]
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"layer\.3", None)
    patcher.add_pattern(r"layer\.[0-9]+", {"density": 0.5})
    report = patcher.patch_model(model)
    assert model.layer[3] is kept
    assert "layer.3" not in [record.name for record in report]
    assert len(report) == 11
    assert all(isinstance(model.layer[i], BlockSparseLinear) for i in range(12) if i != 3)


def test_only_rules_with_none_do_not_warn_and_patch_nothing():
    model = make_net()
    before = snapshot(model)
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"layer\.[0-9]+", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = patcher.patch_model(model)
    assert len(report) == 0
    assert_untouched(model, before)


def test_dry_run_leaves_the_model_untouched_and_reports():
    model = make_net()
    before = snapshot(model)
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"layer\.[0-9]+", {"density": 0.5})
    report = patcher.patch_model(model, dry_run=True)
    assert_untouched(model, before)
    assert isinstance(report, PatchReport) and report.dry_run
    assert [record.name for record in report] == [f"layer.{i}" for i in range(12)]
    assert all(isinstance(record.new_module, BlockSparseLinear) for record in report)
    assert all(record.old_module is model.layer[i] for i, record in enumerate(report))
    assert str(report).startswith("would replace 12 layers")
    # The same rules then patch for real, with the same report.
    real = patcher.patch_model(model)
    assert not real.dry_run and str(real).startswith("replaced 12 layers")
    assert [r.name for r in real] == [r.name for r in report]


def test_report_names_and_parameter_counts():
    model = make_net()
    total_before = sum(p.numel() for p in model.parameters())
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"layer\.(0|5)", {"density": 0.5})
    patcher.add_pattern(r"head", {"density": 0.5, "block_shape": (16, 32), "pseudo_linear": False})
    report = patcher.patch_model(model)
    assert [record.name for record in report] == ["layer.0", "layer.5", "head"]
    layer = [r for r in report if r.name == "layer.0"][0]
    assert layer.params_before == 64 * 64 + 64
    assert layer.params_after == 2 * 32 * 32 + 64  # 2 of the 4 blocks, plus the bias
    head = [r for r in report if r.name == "head"][0]
    assert head.params_before == 64 * 32 + 32
    assert head.params_after == 2 * 16 * 32 + 32  # 2 of the (32/16) x (64/32) = 4 blocks
    assert report.params_before == 2 * (64 * 64 + 64) + 64 * 32 + 32
    assert report.params_after == sum(r.params_after for r in report)
    total_after = sum(p.numel() for p in model.parameters())
    assert total_before - total_after == report.params_before - report.params_after
    text = str(report)
    for name in ("layer.0", "layer.5", "head", f"{report.params_before:,}", f"{report.params_after:,}"):
        assert name in text


def test_get_patchable_layers():
    model = make_net()
    patcher = BlockSparseModelPatcher()
    layers = patcher.get_patchable_layers(model)
    linear_names = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert [layer["name"] for layer in layers] == linear_names
    for layer in layers:
        assert layer["layer"] is model.get_submodule(layer["name"])
        assert re.fullmatch(layer["regexp"], layer["name"])
    assert "norm" not in [layer["name"] for layer in layers]


def test_get_patchable_layers_number_rewrite_gives_one_rule_per_family():
    model = make_net()
    patcher = BlockSparseModelPatcher()
    layers = patcher.get_patchable_layers(model, number_rewrite=True)
    assert [layer["regexp"] for layer in layers] == [r"layer\.[0-9]+", "head", "odd"]
    assert layers[0]["name"] == "layer.0" and layers[0]["layer"] is model.layer[0]
    # The rewritten patterns are usable rules: this one covers all twelve layers.
    patcher.add_pattern(layers[0]["regexp"], {"density": 0.5})
    assert len(patcher.patch_model(model)) == 12


def test_number_rewrite_keeps_digits_inside_names():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.ModuleDict({"fc1": nn.Linear(32, 32), "fc2": nn.Linear(32, 32)})
                                        for _ in range(3))

    layers = BlockSparseModelPatcher().get_patchable_layers(Model(), number_rewrite=True)
    assert [layer["regexp"] for layer in layers] == [r"blocks\.[0-9]+\.fc1", r"blocks\.[0-9]+\.fc2"]


def test_shared_module_becomes_one_new_module_under_every_name():
    model = make_net()
    model.alias = model.layer[2]  # the same module under a second name
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"layer\.2", {"density": 0.5})
    report = patcher.patch_model(model)
    assert len(report) == 1
    assert isinstance(model.layer[2], BlockSparseLinear)
    assert model.alias is model.layer[2]


def test_generic_model_patcher_subclass():
    class Doubler(ModelPatcher):
        def new_child_module(self, child_module_name, child_module, patch_info):
            return nn.Sequential(child_module, nn.Linear(64, 64))

    model = make_net()
    patcher = Doubler()
    patcher.add_pattern(r"layer\.0", {})
    report = patcher.patch_model(model)
    assert [r.name for r in report] == ["layer.0"] and isinstance(model.layer[0], nn.Sequential)
    with pytest.raises(NotImplementedError, match="new_child_module"):
        base = ModelPatcher()
        base.add_pattern(r"head", {})
        base.patch_model(make_net())


# ---------------------------------------------------------------------------------------------------- errors
def test_matched_module_that_is_not_linear_raises_naming_it_and_its_type():
    model = make_net()
    before = snapshot(model)
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"norm", {"density": 0.5})
    with pytest.raises(ValueError, match=r"'norm'.*LayerNorm"):
        patcher.patch_model(model)
    assert_untouched(model, before)


def test_container_matched_by_a_broad_rule_raises():
    model = make_net()
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"layer.*", {"density": 0.5})  # also matches the ModuleList "layer"
    with pytest.raises(ValueError, match=r"'layer'.*ModuleList"):
        patcher.patch_model(model)


def test_already_sparse_layer_raises():
    model = make_net()
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"layer\.0", {"density": 0.5})
    patcher.patch_model(model)
    with pytest.raises(ValueError, match=r"'layer\.0'.*already a sparse BlockSparseLinear"):
        patcher.patch_model(model)


@pytest.mark.parametrize("patch_info, message", [
    ({"density": 0.5}, r"'odd'.*out_features=48.*block_shape\[0\]=32"),
    ({"density": 0.5, "block_shape": (16, 128)}, r"'odd'.*in_features=64.*block_shape\[1\]=128"),
    ({"sparsity": "2:5"}, r"'odd'.*in_features=64.*M=5"),
])
def test_sizes_not_divisible_raise_naming_layer_size_and_block(patch_info, message):
    model = make_net()
    before = snapshot(model)
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"odd", patch_info)
    with pytest.raises(ValueError, match=message):
        patcher.patch_model(model)
    assert_untouched(model, before)


def test_an_error_leaves_the_model_untouched():
    model = make_net()
    before = snapshot(model)
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"layer\.[0-9]+", {"density": 0.5})  # all twelve would convert ...
    patcher.add_pattern(r"odd", {"density": 0.5})  # ... but this one, visited last, cannot
    with pytest.raises(ValueError, match="'odd'"):
        patcher.patch_model(model)
    assert_untouched(model, before)


@pytest.mark.parametrize("where", ["patch_info", "patcher"])
def test_skip_incompatible_warns_and_skips(where):
    model = make_net()
    odd = model.odd
    patcher = BlockSparseModelPatcher(skip_incompatible=(where == "patcher"))
    info = {"density": 0.5}
    if where == "patch_info":
        info["skip_incompatible"] = True
    patcher.add_pattern(r"layer\.[0-9]+|odd", info)
    with pytest.warns(UserWarning, match=r"skipping 'odd'.*out_features=48"):
        report = patcher.patch_model(model)
    assert model.odd is odd
    assert len(report) == 12 and "odd" not in [r.name for r in report]


def test_patch_info_false_skip_overrides_the_patcher_default():
    patcher = BlockSparseModelPatcher(skip_incompatible=True)
    patcher.add_pattern(r"odd", {"skip_incompatible": False})
    with pytest.raises(ValueError, match="'odd'"):
        patcher.patch_model(make_net())


@pytest.mark.parametrize("patch_info, message", [
    ({"densty": 0.5}, r"unknown patch_info keys \['densty'\]"),
    ({"init": "zeros"}, r"init='zeros'"),
    ({"sparsity": "4:2"}, r"sparsity='4:2'"),
    ({"sparsity": "half"}, r"sparsity='half'"),
    ({"block_shape": 32}, r"block_shape=32"),
    ({"density": 1.5}, r"density=1.5"),
])
def test_bad_patch_info_raises_in_add_pattern(patch_info, message):
    with pytest.raises(ValueError, match=message):
        BlockSparseModelPatcher().add_pattern(r"layer\.0", patch_info)


def test_bad_pattern_or_patch_info_type_raise():
    with pytest.raises(ValueError, match="not a valid regex"):
        BlockSparseModelPatcher().add_pattern(r"layer\.(", {"density": 0.5})
    with pytest.raises(TypeError, match="must be a dict or None"):
        BlockSparseModelPatcher().add_pattern(r"layer\.0", 0.5)


def test_nothing_matched_warns_and_lists_patchable_layers():
    model = make_net()
    before = snapshot(model)
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"encoder\.layer\.[0-9]+\.dense", {"density": 0.5})
    with pytest.warns(UserWarning, match="no rule matched") as record:
        report = patcher.patch_model(model)
    message = str(record[0].message)
    for listed in (r"layer\.[0-9]+", "head", "odd"):
        assert listed in message
    assert "norm" not in message
    assert len(report) == 0
    assert_untouched(model, before)


# ---------------------------------------------------------------------------------------------------- options
def test_init_random_draws_a_fresh_pattern_scaled_for_the_density():
    model = make_net()
    old = model.layer[0].weight.detach().clone()
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"layer\.0", {"density": 0.5, "init": "random", "block_shape": (16, 16)})
    patcher.patch_model(model)
    layer = model.layer[0]
    assert isinstance(layer, BlockSparseLinear) and layer.weight.nnz_blocks == 8
    bound = 1 / (0.5 * 64) ** 0.5
    assert layer.weight.data.abs().max() <= bound
    kept = layer.weight.to_dense() != 0
    assert not torch.equal(layer.weight.to_dense()[kept], old[kept])  # fresh values, not the old ones


def test_pseudo_linear_is_masked_dense_with_the_same_function():
    model = make_net()
    reference = copy.deepcopy(model)
    x = torch.randn(5, 64)
    sparse, pseudo = BlockSparseModelPatcher(), BlockSparseModelPatcher()
    sparse.add_pattern(r"layer\.[0-9]+", {"density": 0.5, "block_shape": (16, 32)})
    pseudo.add_pattern(r"layer\.[0-9]+", {"density": 0.5, "block_shape": (16, 32), "pseudo_linear": True})
    sparse.patch_model(model)
    pseudo.patch_model(reference)
    assert all(type(m) is PseudoBlockSparseLinear for m in reference.layer)
    assert reference.layer[0].block_shape == (16, 32)
    torch.testing.assert_close(model(x), reference(x), **FP32)


# ---------------------------------------------------------------------------------------------------- HF models
def tiny_roberta():
    from transformers import RobertaConfig, RobertaForMaskedLM
    config = RobertaConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=128, max_position_embeddings=40, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    return RobertaForMaskedLM(config)


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config)


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=96, n_embd=64, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


# The predecessor README's rules, verbatim, and the Llama and GPT-2 (Conv1D) equivalents.
ROBERTA_RULES = [r"roberta\.encoder\.layer\.[0-9]+\.intermediate\.dense",
                 r"roberta\.encoder\.layer\.[0-9]+\.output\.dense",
                 r"roberta\.encoder\.layer\.[0-9]+\.attention\.output\.dense"]
LLAMA_RULES = [r"model\.layers\.[0-9]+\.mlp\.(gate|up|down)_proj"]
GPT2_RULES = [r"transformer\.h\.[0-9]+\.attn\.c_attn", r"transformer\.h\.[0-9]+\.(attn|mlp)\.c_proj",
              r"transformer\.h\.[0-9]+\.mlp\.c_fc"]
HF_MODELS = {
    "roberta": (tiny_roberta, ROBERTA_RULES, 6, "Linear"),
    "llama": (tiny_llama, LLAMA_RULES, 6, "Linear"),
    "gpt2": (tiny_gpt2, GPT2_RULES, 8, "Conv1D"),
}


def build(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    return HF_MODELS[kind][0]().eval()


def patch(model, kind: str, patch_info) -> PatchReport:
    patcher = BlockSparseModelPatcher()
    for rule in HF_MODELS[kind][1]:
        patcher.add_pattern(rule, dict(patch_info))
    return patcher.patch_model(model)


def dense_weight(module: nn.Module) -> torch.Tensor:
    """(out_features, in_features) weight of an nn.Linear or a transformers Conv1D."""
    return module.weight.detach().t() if type(module).__name__ == "Conv1D" else module.weight.detach()


def mask_in_place(module: nn.Module, mask: torch.Tensor) -> None:
    """Zero the pruned weights of the original dense layer (Conv1D stores its weight transposed)."""
    with torch.no_grad():
        module.weight.mul_(mask.t() if type(module).__name__ == "Conv1D" else mask)


def tokens(seed: int = 1, batch: int = 3, length: int = 12) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 96, (batch, length), generator=generator)


@pytest.mark.parametrize("kind", list(HF_MODELS))
def test_hf_patched_model_equals_masked_dense_model(kind):
    model = build(kind)
    masked = copy.deepcopy(model)
    report = patch(model, kind, {"density": 0.5, "block_shape": (BLOCK, BLOCK)})
    assert len(report) == HF_MODELS[kind][2]
    assert {type(r.old_module).__name__ for r in report} == {HF_MODELS[kind][3]}
    for record in report:
        new = model.get_submodule(record.name)
        assert new is record.new_module and isinstance(new, BlockSparseLinear)
        assert new.density == 0.5
        original = masked.get_submodule(record.name)
        mask = new.weight.element_mask()
        # The kept blocks carry the trained values; converting back gives the masked dense weight.
        torch.testing.assert_close(new.to_dense().weight, dense_weight(original) * mask, rtol=0, atol=0)
        mask_in_place(original, mask)
    ids = tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, masked(ids).logits, **FP32)


@pytest.mark.parametrize("kind", list(HF_MODELS))
def test_hf_patched_model_equals_pseudo_linear_model(kind):
    model = build(kind)
    pseudo = copy.deepcopy(model)
    patch(model, kind, {"density": 0.25, "block_shape": (BLOCK, 2 * BLOCK)})
    report = patch(pseudo, kind, {"density": 0.25, "block_shape": (BLOCK, 2 * BLOCK), "pseudo_linear": True})
    assert {type(r.new_module) for r in report} == {PseudoBlockSparseLinear}
    ids = tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, pseudo(ids).logits, **FP32)


@pytest.mark.parametrize("kind", list(HF_MODELS))
def test_hf_magnitude_init_keeps_the_largest_blocks(kind):
    model = build(kind)
    originals = {name: dense_weight(m).clone() for name, m in model.named_modules()
                 if type(m).__name__ in ("Linear", "Conv1D")}
    report = patch(model, kind, {"density": 0.5, "block_shape": (BLOCK, BLOCK)})
    for record in report:
        weight = originals[record.name]
        rows, cols = weight.shape[0] // BLOCK, weight.shape[1] // BLOCK
        norms = weight.reshape(rows, BLOCK, cols, BLOCK).pow(2).sum(dim=(1, 3)).sqrt()
        kept = record.new_module.weight.block_mask()
        assert int(kept.sum()) == round(0.5 * rows * cols)
        assert norms[kept].min() >= norms[~kept].max(), record.name
        blocks = weight.reshape(rows, BLOCK, cols, BLOCK).transpose(1, 2)[kept]
        torch.testing.assert_close(record.new_module.weight.data.detach(), blocks, rtol=0, atol=0)


@pytest.mark.parametrize("kind", list(HF_MODELS))
def test_hf_training_steps_lower_the_loss(kind):
    model = build(kind)
    report = patch(model, kind, {"density": 0.5, "block_shape": (BLOCK, BLOCK)})
    patterns = {r.name: r.new_module.weight.block_mask().clone() for r in report}
    sparse_params = [r.new_module.weight.data for r in report]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    assert all(any(p is q for q in optimizer.param_groups[0]["params"]) for p in sparse_params)
    ids = tokens(batch=4, length=16)
    model.train()
    losses = []
    for _ in range(8):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in sparse_params)
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses
    for name, pattern in patterns.items():  # training changes values, never the pattern
        assert torch.equal(model.get_submodule(name).weight.block_mask(), pattern)


@pytest.mark.parametrize("kind", list(HF_MODELS))
def test_hf_state_dict_round_trip(kind, tmp_path):
    model = build(kind, seed=0)
    patch(model, kind, {"density": 0.5, "block_shape": (BLOCK, BLOCK)})
    with torch.no_grad():  # make the checkpoint differ from a fresh magnitude patch
        for module in model.modules():
            if isinstance(module, BlockSparseLinear):
                module.weight.data.mul_(1.5)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)

    # Another model, with other weights and so other patterns, takes the checkpoint's pattern and values.
    other = build(kind, seed=1)
    patch(other, kind, {"density": 0.5, "block_shape": (BLOCK, BLOCK), "init": "random"})
    ids = tokens()
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, other(ids).logits)
    other.load_state_dict(torch.load(path, weights_only=True))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, other(ids).logits, rtol=0, atol=0)
    for name, module in model.named_modules():
        if isinstance(module, BlockSparseLinear):
            assert torch.equal(other.get_submodule(name).weight.block_mask(), module.weight.block_mask())


def test_hf_predecessor_readme_code_runs_after_changing_the_import():
    # pytorch_block_sparse 0.1.2 README, "Secondary usage", with only the import changed.
    from pytorch_block_sparse_ng import BlockSparseModelPatcher  # noqa: F811  (the changed line)
    model = build("roberta")
    dense_count = model.num_parameters()
    mp = BlockSparseModelPatcher()
    mp.add_pattern(r"roberta\.encoder\.layer\.[0-9]+\.intermediate\.dense", {"density": 0.5})
    mp.add_pattern(r"roberta\.encoder\.layer\.[0-9]+\.output\.dense", {"density": 0.5})
    mp.add_pattern(r"roberta\.encoder\.layer\.[0-9]+\.attention\.output\.dense", {"density": 0.5})
    mp.patch_model(model)
    # Per layer: (64x128 + 128x64 + 64x64) weights, half of them kept.
    assert model.num_parameters() == dense_count - 2 * (64 * 128 * 2 + 64 * 64) // 2
    assert sum(isinstance(m, BlockSparseLinear) for m in model.modules()) == 6
    with torch.no_grad():
        assert torch.isfinite(model(tokens()).logits).all()


@pytest.mark.parametrize("kind", list(HF_MODELS))
def test_hf_two_four_rule(kind):
    model = build(kind)
    masked = copy.deepcopy(model)
    report = patch(model, kind, {"sparsity": "2:4"})
    assert len(report) == HF_MODELS[kind][2]
    for record in report:
        layer = record.new_module
        assert isinstance(layer, SemiStructuredLinear) and layer.sparsity == (2, 4)
        groups = layer.mask.view(layer.out_features, -1, 4)
        assert (groups.sum(-1) == 2).all(), record.name
        # The two kept of each four are the two largest in magnitude.
        weight = dense_weight(masked.get_submodule(record.name)).view(layer.out_features, -1, 4).abs()
        assert (weight.masked_fill(~groups, float("inf")).amin(-1)
                >= weight.masked_fill(groups, float("-inf")).amax(-1)).all(), record.name
        mask_in_place(masked.get_submodule(record.name), layer.mask)
    ids = tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, masked(ids).logits, **FP32)
    # Training keeps the pruned weights out of the function.
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for _ in range(2):
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    for record in report:
        assert (record.new_module.masked_weight()[~record.new_module.mask] == 0).all()
