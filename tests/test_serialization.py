"""The layout of sparse layers, and the plain state_dict round trip for models that are not transformers models:
a fresh dense model takes a sparse checkpoint with bit-identical outputs; a checkpoint that does not fit the model
or holds inconsistent indices raises a ValueError naming the layer."""

import io
import json

import pytest
import torch
from torch import nn

from pytorch_block_sparse_ng import (BlockSparseLinear, BlockSparseModelPatcher, MaskedLinear, PseudoBlockSparseLinear,
                                     SemiStructuredLinear, load_sparse_state_dict, restore_sparse_layers,
                                     save_sparse_state_dict, sparse_layout)


class Net(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.a = nn.Linear(32, hidden)
        self.b = nn.Linear(hidden, hidden, bias=False)
        self.c = nn.Linear(hidden, hidden)
        self.d = nn.Linear(hidden, 32)
        self.e = nn.Linear(32, 32)

    def forward(self, x):
        x = torch.relu(self.a(x))
        x = torch.relu(self.b(x))
        x = torch.relu(self.c(x))
        return self.e(torch.tanh(self.d(x)))


RULES = {
    "a": {"density": 0.5, "block_shape": (16, 8)},
    "b": {"density": 0.25, "block_shape": (16, 16)},
    "c": {"sparsity": "2:4"},
    "d": {"density": 0.5, "block_shape": (8, 16), "pseudo_linear": True},
}


def sparse_net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    model = Net()
    patcher = BlockSparseModelPatcher()
    for pattern, info in RULES.items():
        patcher.add_pattern(pattern, info)
    patcher.patch_model(model)
    model.e = MaskedLinear(model.e.weight, model.e.bias, torch.rand(32, 32) > 0.3)
    with torch.no_grad():  # values that a fresh magnitude patch of another model would not reproduce
        for p in model.parameters():
            p.mul_(1.25)
    return model


def fresh(seed: int = 1) -> Net:
    torch.manual_seed(seed)
    return Net()


def x_batch():
    return torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(7))


def test_layout_records_every_sparse_layer_and_is_json():
    layout = sparse_layout(sparse_net())
    assert json.loads(json.dumps(layout)) == layout
    layers = layout["layers"]
    assert set(layers) == {"a", "b", "c", "d", "e"}
    assert layers["a"] == dict(kind="block", in_features=32, out_features=64, bias=True, block_shape=[16, 8],
                               nnz_blocks=8, density=0.5)
    assert layers["b"]["bias"] is False and layers["b"]["nnz_blocks"] == 4
    assert layers["c"]["kind"] == "semi_structured" and layers["c"]["sparsity"] == "2:4"
    assert layers["d"] == dict(kind="pseudo_block", in_features=64, out_features=32, bias=True, block_shape=[8, 16])
    assert layers["e"]["kind"] == "masked"
    assert sparse_layout(fresh())["layers"] == {}


@pytest.mark.parametrize("via", ["file", "dict"])
def test_round_trip_into_a_fresh_dense_model_is_bit_identical(via):
    model = sparse_net().eval()
    buffer = io.BytesIO()
    save_sparse_state_dict(model, buffer)
    buffer.seek(0)
    if via == "dict":
        checkpoint = torch.load(buffer, weights_only=True)
        other = load_sparse_state_dict(fresh(), checkpoint["state_dict"], layout=checkpoint["layout"]).eval()
    else:
        other = load_sparse_state_dict(fresh(), buffer).eval()
    for name, cls in (("a", BlockSparseLinear), ("b", BlockSparseLinear), ("c", SemiStructuredLinear),
                      ("d", PseudoBlockSparseLinear), ("e", MaskedLinear)):
        assert type(other.get_submodule(name)) is cls, name
    assert torch.equal(other.a.weight.block_mask(), model.a.weight.block_mask())
    assert other.c.sparsity == (2, 4) and other.d.block_shape == (8, 16)
    with torch.no_grad():
        assert torch.equal(other(x_batch()), model(x_batch()))
    assert sparse_layout(other) == sparse_layout(model)


def test_round_trip_in_another_dtype_follows_the_fresh_model():
    model = sparse_net().eval()
    buffer = io.BytesIO()
    save_sparse_state_dict(model, buffer)
    buffer.seek(0)
    other = load_sparse_state_dict(fresh().to(torch.float64), buffer).eval()
    assert other.a.weight.data.dtype == torch.float64 and other.a.weight.row_offsets.dtype == torch.int32
    with torch.no_grad():
        torch.testing.assert_close(other(x_batch().double()).float(), model(x_batch()), rtol=1e-5, atol=1e-6)


def test_restore_without_loading_gives_the_structure_only():
    layout = sparse_layout(sparse_net())
    other = restore_sparse_layers(fresh(), layout)
    assert sparse_layout(other)["layers"] == layout["layers"]


def _checkpoint(model=None) -> dict:
    model = model or sparse_net()
    return {"layout": sparse_layout(model), "state_dict": {k: v.clone() for k, v in model.state_dict().items()}}


def test_inconsistent_indices_raise_naming_the_layer():
    checkpoint = _checkpoint()
    cols = checkpoint["state_dict"]["a.weight.col_indices"]
    cols[0], cols[1] = cols[1].item(), cols[0].item()  # no longer increasing within the block row
    with pytest.raises(ValueError, match=r"layer 'a'.*col_indices"):
        load_sparse_state_dict(fresh(), checkpoint)


def test_out_of_grid_indices_raise():
    checkpoint = _checkpoint()
    checkpoint["state_dict"]["b.weight.row_indices"][0] = 1000
    with pytest.raises(ValueError, match=r"layer 'b'"):
        load_sparse_state_dict(fresh(), checkpoint)


def test_missing_or_extra_tensor_raises():
    checkpoint = _checkpoint()
    del checkpoint["state_dict"]["a.weight.perm_t"]
    with pytest.raises(ValueError, match=r"layer 'a'.*missing \['weight.perm_t'\]"):
        load_sparse_state_dict(fresh(), checkpoint)
    checkpoint = _checkpoint()
    checkpoint["state_dict"]["c.extra"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"layer 'c'.*unexpected \['extra'\]"):
        load_sparse_state_dict(fresh(), checkpoint)


def test_block_count_that_disagrees_with_the_layout_raises():
    checkpoint = _checkpoint()
    checkpoint["layout"]["layers"]["a"]["nnz_blocks"] = 7
    with pytest.raises(ValueError, match=r"layer 'a'"):
        load_sparse_state_dict(fresh(), checkpoint)


def test_mask_that_breaks_n_m_raises():
    checkpoint = _checkpoint()
    checkpoint["state_dict"]["c.mask"][0, :4] = True  # 4 of 4 kept in one group
    with pytest.raises(ValueError, match=r"layer 'c'.*not 2:4"):
        load_sparse_state_dict(fresh(), checkpoint)


def test_pseudo_block_mask_not_made_of_blocks_raises():
    checkpoint = _checkpoint()
    mask = checkpoint["state_dict"]["d.mask"]
    mask[0, 0] = ~mask[0, 0]
    with pytest.raises(ValueError, match=r"layer 'd'.*whole 8x16 blocks"):
        load_sparse_state_dict(fresh(), checkpoint)


def test_model_of_other_sizes_raises_naming_both():
    with pytest.raises(ValueError, match=r"layer 'a' is \(out_features, in_features\)=\(64, 32\) in the checkpoint "
                                         r"but \(128, 32\) in the model"):
        load_sparse_state_dict(Net(hidden=128), _checkpoint())


def test_model_without_the_layer_or_already_sparse_raises():
    checkpoint = _checkpoint()
    checkpoint["layout"]["layers"]["nowhere"] = dict(checkpoint["layout"]["layers"]["e"])
    with pytest.raises(ValueError, match=r"sparse layer 'nowhere' but Net has no module"):
        load_sparse_state_dict(fresh(), checkpoint)
    with pytest.raises(ValueError, match=r"'a' is already a sparse BlockSparseLinear"):
        load_sparse_state_dict(sparse_net(), _checkpoint())


def test_dense_leftover_keys_raise_strictly():
    checkpoint = _checkpoint()
    checkpoint["state_dict"]["f.weight"] = torch.zeros(2)
    with pytest.raises(ValueError, match=r"Unexpected key.*f\.weight"):
        load_sparse_state_dict(fresh(), checkpoint)


@pytest.mark.parametrize("change, message", [
    (lambda c: c.pop("layout"), "has no layout"),
    (lambda c: c["layout"].update(format="other"), "not a pytorch_block_sparse_ng layout"),
    (lambda c: c["layout"].update(format_version=99), "format_version=99 is not supported"),
    (lambda c: c["layout"]["layers"]["a"].update(kind="diagonal"), "kind='diagonal'"),
    (lambda c: c["layout"]["layers"]["a"].update(block_shape=[0, 8]), "block_shape"),
    (lambda c: c["layout"]["layers"]["c"].update(sparsity="4:2"), "0 < N < M"),
])
def test_malformed_layouts_raise(change, message):
    checkpoint = _checkpoint()
    change(checkpoint)
    with pytest.raises(ValueError, match=message):
        load_sparse_state_dict(fresh(), checkpoint)


def test_pattern_changed_after_patching_is_what_gets_saved():
    model = sparse_net().eval()
    matrix = model.a.weight
    new_mask = ~matrix.block_mask()  # the other half of the blocks (density 0.5)
    matrix.update_pattern(new_mask, torch.randn(matrix.nnz_blocks, *matrix.block_shape))
    other = load_sparse_state_dict(fresh(), _checkpoint(model)).eval()
    assert torch.equal(other.a.weight.block_mask(), new_mask)
    with torch.no_grad():
        assert torch.equal(other(x_batch()), model(x_batch()))
