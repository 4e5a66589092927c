"""Pruning: one-shot (magnitude and Wanda scores, per-layer and global budgets, conversion through the patcher),
masks on dense layers, gradual pruning (cubic schedule, Trainer callback) and transposable 2:4 masks."""

import itertools
import math

import pytest
import torch
from torch import nn

from pytorch_block_sparse_ng import (BlockSparseLinear, BlockSparseModelPatcher, GradualPruner, GradualPruningCallback,
                                     SemiStructuredLinear, apply_masks, collect_input_norms, compare_transposable,
                                     compute_masks, convert_masked_model, cubic_density, kept_magnitude, nm_mask,
                                     prune_model, remove_masks, transposable_nm_mask)
from pytorch_block_sparse_ng.pruning import LayerMask, PruneSpec, masked_density, masked_layers, transposable_patterns

from conftest import MSEModel, RegressionData, trainer_args

FP32 = dict(rtol=1e-5, atol=1e-5)


class Net(nn.Module):
    """Three linear layers of different sizes; ``fc2`` has larger weights than ``fc1`` (for global budgets)."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)
        self.head = nn.Linear(32, 8)
        with torch.no_grad():
            self.fc2.weight.mul_(4.0)

    def forward(self, x):
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def batches(n=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(5, 7, 32, generator=gen) for _ in range(n)]


def tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=32, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


# ------------------------------------------------------------------------------------------- patcher additions
def test_patcher_block_mask_and_mask_keys_keep_exactly_the_given_pattern():
    net = Net()
    block_mask = torch.zeros(4, 2, dtype=torch.bool)
    block_mask[0, 1] = block_mask[3, 0] = True
    nm = nm_mask(-net.fc2.weight, "2:4")  # any valid 2:4 mask, not the magnitude one
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern("fc1", dict(block_shape=(16, 16), block_mask=block_mask))
    patcher.add_pattern("fc2", dict(sparsity="2:4", mask=nm))
    dense = {n: m.weight.detach().clone() for n, m in net.named_children()}
    patcher.patch_model(net)
    assert isinstance(net.fc1, BlockSparseLinear) and torch.equal(net.fc1.weight.block_mask(), block_mask)
    torch.testing.assert_close(net.fc1.weight.to_dense(), dense["fc1"] * net.fc1.weight.element_mask())
    assert isinstance(net.fc2, SemiStructuredLinear) and torch.equal(net.fc2.mask, nm)
    assert torch.equal(net.fc2.masked_weight(), dense["fc2"] * nm)


def test_patcher_mask_key_errors():
    patcher = BlockSparseModelPatcher()
    with pytest.raises(ValueError, match=r"block_mask for 'fc1' needs sparsity='block', init='magnitude' and no "
                                         r"density \(got sparsity='block', init='magnitude', density=0.5\)"):
        patcher.add_pattern("fc1", dict(block_mask=torch.ones(2, 2, dtype=torch.bool), density=0.5))
    with pytest.raises(ValueError, match="mask for 'fc2' needs sparsity='N:M'"):
        patcher.add_pattern("fc2", dict(mask=torch.ones(2, 4, dtype=torch.bool)))
    with pytest.raises(ValueError, match="must be a 2-D bool tensor, got torch.float32"):
        patcher.add_pattern("fc1", dict(block_mask=torch.ones(2, 2)))
    patcher.add_pattern("fc1", dict(block_shape=(16, 16), block_mask=torch.ones(3, 2, dtype=torch.bool)))
    with pytest.raises(ValueError, match=r"cannot patch 'fc1': block_mask.shape=\(3, 2\) must be the block grid "
                                         r"\(4, 2\)"):
        patcher.patch_model(Net())
    too_many = torch.ones(64, 32, dtype=torch.bool)
    with pytest.raises(ValueError, match="mask keeps 4 weights in a group of M=4 consecutive inputs; sparsity 2:4 "
                                         "allows at most N=2"):
        SemiStructuredLinear.from_dense(nn.Linear(32, 64), "2:4", mask=too_many)
    with pytest.raises(ValueError, match=r"mask must be bool of shape \(64, 32\)"):
        SemiStructuredLinear.from_dense(nn.Linear(32, 64), "2:4", mask=too_many.t())


# ------------------------------------------------------------------------------------------------- scores
def test_collect_input_norms_matches_the_stacked_inputs():
    net, data = Net(), batches()
    norms = collect_input_norms(net, data, names=["fc1", "fc2"])
    stacked = torch.cat([x.reshape(-1, 32) for x in data])
    torch.testing.assert_close(norms["fc1"], stacked.norm(dim=0), **FP32)
    hidden = torch.relu(net.fc1(stacked))
    torch.testing.assert_close(norms["fc2"], hidden.detach().norm(dim=0), **FP32)
    assert not net.fc1._forward_pre_hooks  # hooks removed
    with pytest.raises(ValueError, match=r"names=\['relu'\] are not nn.Linear/Conv1D layers of Net"):
        collect_input_norms(net, data, names=["relu"])
    with pytest.raises(ValueError, match="batches is empty"):
        collect_input_norms(net, [])


def test_wanda_score_follows_the_input_scale_and_magnitude_does_not():
    net = Net()
    with torch.no_grad():
        net.fc1.weight.fill_(1.0)
    data = [torch.randn(64, 32) * torch.where(torch.arange(32) < 16, 0.01, 1.0)]  # inputs 0..15 nearly silent
    rules = {"fc1": dict(density=0.5, block_shape=(64, 16))}
    wanda = compute_masks(net, rules, score="wanda", calibration=data, progress=False)["fc1"]
    assert wanda.block_mask.tolist() == [[False, True]]
    magnitude = compute_masks(net, {"fc1": dict(density=0.5, block_shape=(64, 16))}, score="l2", progress=False)
    assert int(magnitude["fc1"].block_mask.sum()) == 1  # a tie: one of the two, whichever


def test_l1_and_l2_scores_choose_different_blocks():
    layer = nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[3.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]]))  # block0: l2 3, l1 3
    model = nn.Sequential(layer)                                                          # block1: l2 2, l1 4
    rules = {"0": dict(density=0.5, block_shape=(2, 2))}
    assert compute_masks(model, rules, score="l2", progress=False)["0"].block_mask.tolist() == [[True, False]]
    assert compute_masks(model, rules, score="l1", progress=False)["0"].block_mask.tolist() == [[False, True]]


# ---------------------------------------------------------------------------------------------- compute_masks
@pytest.mark.parametrize("density", [0.0, 0.25, 0.5, 1.0])
def test_block_and_vector_masks_hit_the_density(density):
    net = Net()
    masks = compute_masks(net, [("fc1", dict(density=density, block_shape=(16, 8))),
                                ("fc2", dict(sparsity="vector", density=density, vector_length=4, vector_dim=0))],
                          progress=False)
    assert masks["fc1"].density == pytest.approx(density)
    assert masks["fc2"].density == pytest.approx(density)
    assert masks["fc2"].spec.block_shape == (4, 1)
    # the kept blocks are the ones of largest L2 norm
    norms = net.fc1.weight.detach().reshape(4, 16, 4, 8).pow(2).sum((1, 3))
    kept, dropped = norms[masks["fc1"].block_mask], norms[~masks["fc1"].block_mask]
    if kept.numel() and dropped.numel():
        assert kept.min() >= dropped.max()


def test_nm_and_transposable_masks_and_rule_order():
    net = Net()
    masks = compute_masks(net, [("fc1", {"sparsity": "2:4", "transposable": True}), ("fc.*", {"sparsity": "1:4"}),
                                ("head", None)], progress=False)
    assert set(masks) == {"fc1", "fc2"}  # head left alone, first matching rule wins for fc1
    # score "l2" keeps the most squared magnitude per 4x4 block, "l1" the most absolute magnitude
    assert torch.equal(masks["fc1"].mask, transposable_nm_mask(net.fc1.weight, scores=net.fc1.weight.pow(2)))
    l1 = compute_masks(net, {"fc1": {"sparsity": "2:4", "transposable": True}}, score="l1", progress=False)
    assert torch.equal(l1["fc1"].mask, transposable_nm_mask(net.fc1.weight))
    assert torch.equal(masks["fc2"].mask, nm_mask(net.fc2.weight, "1:4"))
    assert masks["fc1"].block_mask is None


def test_global_density_spreads_the_budget_by_score():
    net = Net()  # fc2's weights are 4x larger: a global magnitude budget keeps more of fc2
    masks = compute_masks(net, {"fc[12]": dict(block_shape=(8, 8))}, global_density=0.3, progress=False)
    kept = sum(int(m.mask.sum()) for m in masks.values())
    total = sum(m.mask.numel() for m in masks.values())
    assert kept == pytest.approx(0.3 * total, abs=64)  # within one block of the budget
    assert masks["fc2"].density > 0.5 > masks["fc1"].density
    # the blocks kept over both layers are the best by mean score
    scores = torch.cat([m.weight.detach().pow(2).reshape(-1, 8, m.weight.shape[1] // 8, 8).sum((1, 3)).flatten()
                        for m in (net.fc1, net.fc2)])
    chosen = torch.cat([masks[n].block_mask.flatten() for n in ("fc1", "fc2")])
    assert scores[chosen].min() >= scores[~chosen].max()
    floor = compute_masks(net, {"fc[12]": dict(block_shape=(8, 8))}, global_density=0.3, min_density=0.25,
                          progress=False)
    assert floor["fc1"].density >= 0.25
    assert sum(int(m.mask.sum()) for m in floor.values()) == pytest.approx(0.3 * total, abs=64)


def test_progress_bar_over_layers(capsys):
    compute_masks(Net(), {"fc.*": 0.5}, progress=True)
    assert "pruning" in capsys.readouterr().err
    compute_masks(Net(), {"fc.*": dict(density=0.5, block_shape=(8, 8))}, progress=False)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("rules,kwargs,error,match", [
    ({"fc1": dict(density=0.5, colour="red")}, {}, ValueError, r"unknown keys \['colour'\] in the rule for 'fc1'"),
    ({"fc1": dict(sparsity="2:4", density=0.5)}, {}, ValueError,
     r"density=0.5 in the rule for 'fc1' conflicts with sparsity='2:4'"),
    ({"fc1": dict(sparsity="4:8", transposable=True)}, {}, ValueError, "transposable=True in the rule for 'fc1' "
                                                                       "needs sparsity='2:4'"),
    ({"fc1": dict(density=1.5)}, {}, ValueError, r"density=1.5 must be in \[0, 1\]"),
    ({"fc1": dict(density=0.5, block_shape=(48, 8))}, {}, ValueError,
     r"layer 'fc1' \(rule 'fc1'\): out_features=64 must be a multiple of block_shape\[0\]=48"),
    ({"head": dict(sparsity="2:3")}, {}, ValueError, r"in_features=32 must be a multiple of M=3"),
    ({"conv.*": 0.5}, {}, ValueError, r"no rule of \['conv.\*'\] matched a linear layer of Net .* linear layers: "
                                      r"fc1, fc2, head"),
    ({"fc1": dict(block_shape=(8, 8))}, {}, ValueError, r"the rule 'fc1' \(layer 'fc1'\) needs a density"),
    ({"fc1": 0.5}, dict(global_density=0.5), ValueError, "sets density=0.5 but global_density=0.5 is given"),
    ({"fc1": 0.5}, dict(score="wanda"), ValueError, r"score='wanda' \(layers \['fc1'\]\) needs calibration"),
    ({"fc1": 0.5}, dict(score="max"), ValueError, r"score='max' must be one of \('l2', 'l1', 'wanda'\)"),
    ({"fc1": dict(sparsity="2:4")}, dict(global_density=0.5), ValueError, "needs at least one block or vector rule"),
    ({"(": 0.5}, {}, ValueError, r"pattern='\(' is not a valid regex"),
    ({"fc1": "dense"}, {}, TypeError, "the rule for 'fc1' must be a dict, a density"),
    ({}, {}, ValueError, "rules is empty"),
])
def test_compute_masks_errors_name_argument_value_and_rule(rules, kwargs, error, match):
    with pytest.raises(error, match=match):
        compute_masks(Net(), rules, progress=False, **kwargs)


# ---------------------------------------------------------------------------------- prune + convert / masks
def test_prune_model_converts_with_the_same_outputs_as_the_masked_model():
    x = batches(1)[0]
    rules = {"fc1": dict(density=0.5, block_shape=(16, 8)), "fc2": dict(sparsity="2:4")}
    masked, converted = Net(), Net()
    prune_model(masked, rules, score="wanda", calibration=batches(), convert=False, progress=False)
    result = prune_model(converted, rules, score="wanda", calibration=batches(), convert=True, progress=False)
    assert isinstance(converted.fc1, BlockSparseLinear) and isinstance(converted.fc2, SemiStructuredLinear)
    assert isinstance(converted.head, nn.Linear) and len(result.report) == 2
    assert result.density == pytest.approx(0.5)
    assert set(masked_layers(masked)) == {"fc1", "fc2"}
    torch.testing.assert_close(converted(x), masked(x), **FP32)
    assert "fc1: blocks (16, 8), density 0.5" in str(result)


def test_masked_training_keeps_pruned_weights_out_and_converts_identically():
    net = Net()
    prune_model(net, {"fc1": dict(density=0.25, block_shape=(8, 8)), "fc2": dict(sparsity="2:4")}, convert=False,
                progress=False)
    masks = {n: p.layer_mask().clone() for n, (_, p) in masked_layers(net).items()}
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)  # moves pruned originals
    x, y = batches(1)[0], torch.randn(5, 7, 8)
    for _ in range(3):
        nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    for name in masks:
        weight = getattr(net, name).weight
        assert torch.all(weight[~masks[name]] == 0)
    reference = net(x)
    report = convert_masked_model(net)
    assert len(report) == 2 and not masked_layers(net)
    torch.testing.assert_close(net(x), reference, **FP32)


def test_apply_masks_remove_masks_and_errors():
    net = Net()
    spec = PruneSpec(0.5, (8, 8))
    mask = torch.rand(64, 32) > 0.5
    apply_masks(net, {"fc1": LayerMask("fc1", spec, mask)})
    assert masked_density(net) == pytest.approx(float(mask.float().mean()))
    apply_masks(net, {"fc1": LayerMask("fc1", spec, mask & False)})  # update in place
    assert masked_density(net) == 0.0 and len(net.fc1.parametrizations.weight) == 1
    remove_masks(net)
    assert not masked_layers(net) and torch.all(net.fc1.weight == 0) and type(net.fc1) is nn.Linear
    with pytest.raises(ValueError, match=r"mask for 'fc2' has shape \(64, 32\), the layer's weight is "
                                         r"\(out_features, in_features\)=\(32, 64\)"):
        apply_masks(net, {"fc2": LayerMask("fc2", spec, mask)})
    with pytest.raises(ValueError, match="'relu' is not an nn.Linear / Conv1D layer of Net"):
        apply_masks(net, {"relu": LayerMask("relu", spec, mask)})
    with pytest.raises(ValueError, match="Net holds no masks"):
        convert_masked_model(net)


@pytest.mark.parametrize("make,rules", [
    (tiny_gpt2, {r"transformer\.h\.[0-9]+\.mlp\.c_fc": dict(density=0.5, block_shape=(16, 16)),
                 r"transformer\.h\.[0-9]+\.(attn|mlp)\.c_proj": dict(sparsity="2:4")}),
    (tiny_llama, {r"model\.layers\.[0-9]+\.mlp\.(gate|up)_proj": dict(sparsity="vector", density=0.5,
                                                                       vector_length=8),
                  r"model\.layers\.[0-9]+\.mlp\.down_proj": dict(sparsity="2:4", transposable=True)}),
], ids=["gpt2-conv1d", "llama"])
def test_hf_models_pruned_masked_then_converted_give_the_same_logits(make, rules):
    from collections import UserDict

    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    calibration = [UserDict(input_ids=ids)]  # a Mapping that is not a dict, like a tokenizer's BatchEncoding
    model = make()
    prune_model(model, rules, score="wanda", calibration=calibration, convert=False, progress=False)
    with torch.no_grad():
        masked_logits = model(input_ids=ids).logits
    report = convert_masked_model(model)
    assert len(report) == 6
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, masked_logits, **FP32)
    direct = make()
    prune_model(direct, rules, score="wanda", calibration=calibration, convert=True, progress=False)
    with torch.no_grad():
        torch.testing.assert_close(direct(input_ids=ids).logits, masked_logits, **FP32)


# ----------------------------------------------------------------------------------------------- gradual
def test_cubic_density_schedule():
    assert cubic_density(0, 0.2, 10, 110) == 1.0
    assert cubic_density(10, 0.2, 10, 110) == 1.0
    assert cubic_density(60, 0.2, 10, 110) == pytest.approx(0.2 + 0.8 * 0.5 ** 3)
    assert cubic_density(110, 0.2, 10, 110) == 0.2
    assert cubic_density(500, 0.2, 10, 110) == 0.2
    values = [cubic_density(t, 0.2, 10, 110) for t in range(120)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert cubic_density(5, 0.3, 5, 5) == 0.3
    with pytest.raises(ValueError, match="end_step=1 must be >= begin_step=2"):
        cubic_density(0, 0.5, 2, 1)


def test_gradual_pruner_follows_the_schedule_and_hits_the_target():
    net = Net()
    pruner = GradualPruner(net, {"fc1": dict(density=0.25, block_shape=(8, 8)), "fc2": dict(sparsity="2:4")},
                           begin_step=2, end_step=11, frequency=3)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    x, y = batches(1)[0], torch.randn(5, 7, 8)
    pruned_at, history = [], []
    for step in range(15):
        nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if pruner.step():
            pruned_at.append(step)
        history.append({n: p.layer_mask().clone() for n, (_, p) in masked_layers(net).items()})
    assert pruned_at == [2, 5, 8, 11]
    for before, after in zip(history, history[1:]):  # masks only shrink
        for name in before:
            assert not (after[name] & ~before[name]).any()
    fc1_density = [h["fc1"].float().mean().item() for h in history]
    assert fc1_density[4] == 1.0 and fc1_density[5] == pytest.approx(
        round(cubic_density(5, 0.25, 2, 11) * 32) / 32)
    assert fc1_density[-1] == 0.25
    fc2_groups = [int(h["fc2"].view(32, 16, 4).sum(-1).max()) for h in history]
    assert fc2_groups[0] == 4 and fc2_groups[-1] == 2 and 3 in fc2_groups  # 4 -> 3 -> 2 of each group of 4
    assert pruner.density() == pytest.approx((0.25 + 0.5) / 2)
    reference = net(x)
    pruner.convert()
    assert isinstance(net.fc1, BlockSparseLinear) and net.fc1.density == 0.25
    assert isinstance(net.fc2, SemiStructuredLinear)
    torch.testing.assert_close(net(x), reference, **FP32)


def test_gradual_pruner_global_density_and_errors():
    net = Net()
    pruner = GradualPruner(net, {"fc[12]": dict(block_shape=(8, 8))}, end_step=4, frequency=2, global_density=0.2)
    for step in range(6):
        pruner.step(step)
    assert pruner.density() == pytest.approx(0.2, abs=64 / 4096)
    with pytest.raises(ValueError, match="frequency=0 must be an integer >= 1"):
        GradualPruner(Net(), {"fc1": 0.5}, end_step=4, frequency=0)
    with pytest.raises(ValueError, match="end_step=1 must be >= begin_step=3"):
        GradualPruner(Net(), {"fc1": 0.5}, begin_step=3, end_step=1)
    with pytest.raises(ValueError, match="score='wanda' must be 'l2' or 'l1'"):
        GradualPruner(Net(), {"fc1": 0.5}, end_step=4, score="wanda")
    with pytest.raises(ValueError, match="give a density per rule or global_density=None, exactly one"):
        GradualPruner(Net(), {"fc1": dict(block_shape=(8, 8))}, end_step=4)


def test_gradual_pruning_callback_with_the_trainer(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")

    model = MSEModel(Net())
    pruner = GradualPruner(model, {r"net\.fc1": dict(density=0.25, block_shape=(8, 8))}, end_step=6, frequency=2)
    args = trainer_args(transformers, tmp_path, max_steps=8)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=RegressionData(8),
                                   callbacks=[GradualPruningCallback(pruner)])
    trainer.train()
    assert pruner.last_step == 6 and pruner.density() == 0.25
    assert isinstance(GradualPruningCallback(pruner), transformers.TrainerCallback)
    with pytest.raises(TypeError, match="pruner must be a GradualPruner"):
        GradualPruningCallback(object())


# ------------------------------------------------------------------------------------------ transposable 2:4
def test_transposable_patterns_are_all_90():
    patterns = transposable_patterns()
    brute = [p for p in itertools.product((0, 1), repeat=16)
             if all(sum(p[4 * r:4 * r + 4]) == 2 for r in range(4)) and all(sum(p[c::4]) == 2 for c in range(4))]
    assert patterns.shape == (90, 4, 4) and len(brute) == 90
    assert {tuple(p.flatten().int().tolist()) for p in patterns} == set(brute)


def test_transposable_mask_is_2_4_both_ways_and_optimal_per_block():
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(8, 12, generator=gen)
    mask = transposable_nm_mask(weight)
    assert (mask.view(8, 3, 4).sum(-1) == 2).all() and (mask.t().reshape(12, 2, 4).sum(-1) == 2).all()
    candidates = transposable_patterns()
    for r, c in itertools.product(range(2), range(3)):
        block = weight[4 * r:4 * r + 4, 4 * c:4 * c + 4].abs()
        best = max(float(block[p].sum()) for p in candidates)
        assert float(block[mask[4 * r:4 * r + 4, 4 * c:4 * c + 4]].sum()) == pytest.approx(best)
    result = compare_transposable(weight)
    assert result["transposable"] <= result["plain"] <= 1.0
    assert result["plain"] == pytest.approx(kept_magnitude(weight, nm_mask(weight, "2:4")))
    assert result["ratio"] == pytest.approx(result["transposable"] / result["plain"])
    # a weight that is already 2:4 both ways keeps everything either way
    exact = weight * mask
    assert compare_transposable(exact) == pytest.approx(dict(plain=1.0, transposable=1.0, ratio=1.0))


def test_transposable_errors():
    with pytest.raises(ValueError, match=r"weight.shape\[0\]=6 must be a multiple of 4"):
        transposable_nm_mask(torch.randn(6, 8))
    with pytest.raises(ValueError, match="sparsity='1:4' must be '2:4'"):
        transposable_nm_mask(torch.randn(8, 8), "1:4")
    with pytest.raises(ValueError, match="norm='max' must be 'l1' or 'l2'"):
        kept_magnitude(torch.randn(4, 4), torch.ones(4, 4, dtype=torch.bool), "max")


# ------------------------------------------------------------------------------------------- accuracy study
def test_accuracy_study_script_runs_with_tiny_settings(tmp_path, capsys):
    import importlib.util
    import json
    import os

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "accuracy_study.py")
    spec = importlib.util.spec_from_file_location("accuracy_study", path)
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    out = tmp_path / "results.json"
    study.main(["--seeds", "0", "--steps", "4", "--finetune-steps", "2", "--d", "32", "--heads", "2",
                "--context", "16", "--batch-size", "4", "--update-frequency", "2", "--threads", "1",
                "--json", str(out)])
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())["results"]
    for name in ("dense", "2:4 + fine-tune (l2)", "2:4 transposable + fine-tune (l1)", "block static", "block RigL"):
        assert f"| {name} |" in printed and math.isfinite(results[name]["mean"])
    assert results["dense"]["relative"] == 0.0
