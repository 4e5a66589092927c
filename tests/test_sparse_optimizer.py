"""SparseOptimizer: the predecessor's usage, drop-and-grow choices (magnitude and RigL), new-block values, the
exact move / reset of optimizer state, the dense gradient recorder, schedules and errors."""

import math

import pytest
import torch
from torch import nn

from pytorch_block_sparse_ng import (BlockSparseLinear, BlockSparseMatrix, MagnitudeSparseOptimizerStrategy,
                                     RigLSparseOptimizerStrategy, SparseOptimizer, SparseOptimizerCallback,
                                     drop_fraction_schedule)
from pytorch_block_sparse_ng.pruning import move_optimizer_state

from conftest import MSEModel, RegressionData, trainer_args

BLOCK = (8, 8)


def make_model(seed=0, density=0.5):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    return nn.Sequential(BlockSparseLinear(32, 64, density=density, block_shape=BLOCK, generator=gen), nn.ReLU(),
                         BlockSparseLinear(64, 16, density=density, block_shape=BLOCK, generator=gen))


def train_steps(model, optimizer, steps=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(12, 32, generator=gen), torch.randn(12, 16, generator=gen)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


def positions(matrix):
    return list(zip(matrix.row_indices.tolist(), matrix.col_indices.tolist()))


def test_sparse_objects_and_the_predecessor_usage():
    model = make_model()
    objs = SparseOptimizer.sparse_objects(model)
    assert objs == [model[0].weight, model[2].weight]
    adam = torch.optim.Adam(model.parameters(), lr=1e-2)
    so = SparseOptimizer(objs, lr=0.25)
    so.attach_optimizer(adam)
    train_steps(model, adam)
    before = [(positions(m), m.data.detach().clone(), m.block_norm()) for m in objs]
    assert so.step()
    for matrix, (old_positions, old_data, old_norms) in zip(objs, before):
        matrix.validate()
        nnz = len(old_positions)
        k = int(0.25 * nnz)
        dropped = {old_positions[i] for i in old_norms.argsort()[:k].tolist()}
        new_positions = positions(matrix)
        assert len(new_positions) == nnz
        assert not dropped & set(new_positions)  # the weakest are gone ...
        grown = set(new_positions) - set(old_positions)
        assert len(grown) == k  # ... replaced by as many new blocks at positions free before
        for slot, pos in enumerate(new_positions):  # survivors keep their values
            if pos in old_positions:
                assert torch.equal(matrix.data[slot], old_data[old_positions.index(pos)])


@pytest.mark.parametrize("distribution", ["uniform", "gaussian", "zeros"])
def test_new_block_values(distribution):
    matrix = BlockSparseMatrix.randn((64, 64), density=0.5, block_shape=BLOCK,
                                     generator=torch.Generator().manual_seed(0))
    old = set(positions(matrix))
    strategy = MagnitudeSparseOptimizerStrategy(0.5, distribution, 0.1, torch.Generator().manual_seed(1))
    source = strategy.run(matrix)
    new_slots = (source < 0).nonzero().squeeze(1)
    assert len(new_slots) == 16 and all(positions(matrix)[s] not in old for s in new_slots.tolist())
    values = matrix.data.detach()[new_slots]
    kept = matrix.data.detach()[source >= 0]  # new values are scaled from the blocks that were kept
    std, mean = float(kept.std()), float(kept.mean())
    if distribution == "zeros":
        assert torch.all(values == 0)
    elif distribution == "uniform":
        assert values.abs().max() <= 0.1 * std and values.std() > 0.02 * std
    else:
        assert abs(float(values.mean()) - 0.1 * mean) < 0.02 * std
        assert float(values.std()) == pytest.approx(0.1 * std, rel=0.2)


@pytest.mark.parametrize("make_optimizer,keys", [
    (lambda p: torch.optim.Adam(p, lr=1e-2), ("exp_avg", "exp_avg_sq")),
    (lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True), ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")),
    (lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01), ("exp_avg", "exp_avg_sq")),
    (lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9), ("momentum_buffer",)),
], ids=["adam", "adam-amsgrad", "adamw", "sgd-momentum"])
@pytest.mark.parametrize("method", ["magnitude", "rigl"])
def test_optimizer_state_moves_with_surviving_blocks_and_resets_for_new_ones(make_optimizer, keys, method):
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    train_steps(model, optimizer, steps=3)
    objs = SparseOptimizer.sparse_objects(model)
    so = SparseOptimizer(objs, lr=0.3, method=method, model=model, generator=torch.Generator().manual_seed(0))
    so.attach_optimizer(optimizer)
    train_steps(model, optimizer, steps=1, seed=1)  # the backward before the update (RigL records it)
    old = {id(m): (positions(m), {k: optimizer.state[m.data][k].clone() for k in keys}) for m in objs}
    steps = {id(m): optimizer.state[m.data].get("step") for m in objs}
    steps = {k: None if v is None else v.clone() for k, v in steps.items()}
    so.step()
    for matrix in objs:
        old_positions, old_state = old[id(matrix)]
        state = optimizer.state[matrix.data]
        n_new = 0
        for slot, pos in enumerate(positions(matrix)):
            fresh = pos not in old_positions or (method == "rigl" and torch.all(matrix.data[slot] == 0))
            for key in keys:
                if fresh:  # a new block (RigL: possibly regrown where one was just dropped)
                    assert torch.all(state[key][slot] == 0)
                else:
                    assert torch.equal(state[key][slot], old_state[key][old_positions.index(pos)])
            n_new += pos not in old_positions
        assert n_new > 0
        if steps[id(matrix)] is not None:
            assert torch.equal(state["step"], steps[id(matrix)])
    train_steps(model, optimizer, steps=1, seed=2)  # training goes on with the rearranged state


def test_move_optimizer_state_exact_mapping_and_grad():
    param = nn.Parameter(torch.arange(4.0).view(4, 1, 1).repeat(1, 2, 2))
    optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    param.grad = param.detach() * 10
    optimizer.step()
    param.grad = param.detach().clone()
    momentum = optimizer.state[param]["momentum_buffer"].clone()
    source = torch.tensor([2, -1, 0, -1])
    assert move_optimizer_state(optimizer, param, source)
    buf = optimizer.state[param]["momentum_buffer"]
    assert torch.equal(buf[0], momentum[2]) and torch.equal(buf[2], momentum[0])
    assert torch.all(buf[1] == 0) and torch.all(buf[3] == 0) and torch.all(param.grad[[1, 3]] == 0)
    assert not move_optimizer_state(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), param, source)


def dense_reference_grad(model, x, y):
    """dL/dW of each layer's dense weight, through an equivalent dense model."""
    dense = [layer.weight.to_dense().detach().requires_grad_(True) for layer in (model[0], model[2])]
    hidden = torch.relu(nn.functional.linear(x, dense[0], model[0].bias))
    nn.functional.mse_loss(nn.functional.linear(hidden, dense[1], model[2].bias), y).backward()
    return [d.grad for d in dense]


def test_rigl_records_the_dense_gradient_and_grows_where_it_is_largest():
    model = make_model(density=0.25)
    adam = torch.optim.Adam(model.parameters(), lr=1e-2)
    objs = SparseOptimizer.sparse_objects(model)
    so = SparseOptimizer(objs, lr=0.5, method="rigl", model=model)
    so.attach_optimizer(adam)
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(2, 6, 32, generator=gen), torch.randn(2, 6, 16, generator=gen)  # 3-D input
    expected = dense_reference_grad(model, x, y)
    for half in (slice(0, 1), slice(1, 2)):  # gradient accumulation over two micro-batches
        nn.functional.mse_loss(model(x[half]), y[half]).mul(0.5).backward()
    for matrix, grad in zip(objs, expected):
        torch.testing.assert_close(so.recorder.get(matrix), grad, rtol=1e-4, atol=1e-6)
    before = [(m.block_mask().clone(), m.block_norm()) for m in objs]
    so.step()
    for matrix, grad, (old_mask, old_norms) in zip(objs, expected, before):
        k = int(0.5 * int(old_mask.sum()))
        weakest = old_norms.argsort()[:k]
        kept = old_mask.clone()
        old_rows, old_cols = torch.nonzero(old_mask, as_tuple=True)
        kept[old_rows[weakest], old_cols[weakest]] = False
        R, C = matrix.grid
        norms = grad.reshape(R, 8, C, 8).pow(2).sum((1, 3)).masked_fill(kept, -1)
        expected_new = torch.zeros_like(kept)
        expected_new.view(-1)[norms.flatten().topk(k).indices] = True
        assert torch.equal(matrix.block_mask(), kept | expected_new)
        new_slots = expected_new[matrix.row_indices.long(), matrix.col_indices.long()]
        assert torch.all(matrix.data[new_slots] == 0)  # RigL: new blocks start at zero
    assert so.recorder.grads == {}  # freed after the update


def test_recorder_is_armed_only_before_updates():
    model = make_model()
    adam = torch.optim.Adam(model.parameters(), lr=1e-2)
    so = SparseOptimizer(SparseOptimizer.sparse_objects(model), lr=0.25, method="rigl", model=model,
                         update_frequency=3)
    so.attach_optimizer(adam)
    updates = []
    for step in range(1, 7):
        assert so.recorder.enabled == (step % 3 == 0)
        train_steps(model, adam, steps=1, seed=step)
        assert bool(so.recorder.grads) == (step % 3 == 0)
        updates.append(so.step())
    assert updates == [False, False, True, False, False, True]
    so.recorder.remove()
    assert not model[0]._forward_hooks


def test_drop_fraction_schedules():
    cosine = drop_fraction_schedule("cosine", total_steps=100)
    assert cosine(0) == 1.0 and cosine(50) == pytest.approx(0.5) and cosine(100) == 0.0 and cosine(1000) == 0.0
    assert cosine(25) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    linear = drop_fraction_schedule("linear", total_steps=10)
    assert linear(5) == 0.5 and linear(20) == 0.0
    assert drop_fraction_schedule()(10 ** 6) == 1.0
    model = make_model()
    adam = torch.optim.Adam(model.parameters(), lr=1e-2)
    so = SparseOptimizer(SparseOptimizer.sparse_objects(model), lr=0.5, drop_schedule="cosine", total_steps=4)
    so.attach_optimizer(adam)
    assert so.drop_fraction() == pytest.approx(0.5 * 0.5 * (1 + math.cos(math.pi / 4)))
    changed = []
    for _ in range(6):
        train_steps(model, adam, steps=1)
        before = model[0].weight.block_mask().clone()
        so.step()
        changed.append(not torch.equal(before, model[0].weight.block_mask()))
    assert changed == [True, True, True, False, False, False]


def test_dynamic_sparse_training_learns():
    torch.manual_seed(0)
    target = nn.Linear(32, 16)
    model = make_model(seed=1)
    adam = torch.optim.Adam(model.parameters(), lr=1e-2)
    so = SparseOptimizer(SparseOptimizer.sparse_objects(model), lr=0.2, method="rigl", model=model,
                         update_frequency=5)
    so.attach_optimizer(adam)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(60):
        x = torch.randn(32, 32, generator=gen)
        loss = nn.functional.mse_loss(model(x), target(x).detach())
        loss.backward()
        adam.step()
        adam.zero_grad()
        so.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])
    for matrix in SparseOptimizer.sparse_objects(model):
        matrix.validate()
        assert matrix.density == 0.5


def test_full_density_and_zero_fraction_change_nothing():
    matrix = BlockSparseMatrix.randn((16, 16), density=1.0, block_shape=BLOCK)
    data = matrix.data.detach().clone()
    source = MagnitudeSparseOptimizerStrategy(0.5).run(matrix)
    assert torch.equal(source, torch.arange(4)) and torch.equal(matrix.data, data)
    matrix = BlockSparseMatrix.randn((16, 16), density=0.5, block_shape=BLOCK)
    data = matrix.data.detach().clone()
    assert torch.equal(RigLSparseOptimizerStrategy(0.0).run(matrix), torch.arange(2))
    assert torch.equal(matrix.data, data)


def test_errors():
    model = make_model()
    objs = SparseOptimizer.sparse_objects(model)
    with pytest.raises(ValueError, match=r"lr=1.5 \(the fraction of blocks replaced\) must be in \[0, 1\]"):
        SparseOptimizer(objs, lr=1.5)
    with pytest.raises(ValueError, match=r"method='prune' must be one of \('magnitude', 'rigl'\)"):
        SparseOptimizer(objs, method="prune")
    with pytest.raises(ValueError, match="method='rigl' needs model="):
        SparseOptimizer(objs, method="rigl")
    with pytest.raises(ValueError, match="new_coefficients_distribution='normal' must be one of"):
        SparseOptimizer(objs, new_coefficients_distribution="normal")
    with pytest.raises(ValueError, match="update_frequency=0 must be an int >= 1"):
        SparseOptimizer(objs, update_frequency=0)
    with pytest.raises(ValueError, match="total_steps=None must be a positive int for kind='cosine'"):
        SparseOptimizer(objs, drop_schedule="cosine")
    with pytest.raises(TypeError, match="sparse_objects must be BlockSparseMatrix objects, got Linear"):
        SparseOptimizer([nn.Linear(2, 2)])
    with pytest.raises(ValueError, match="are not the weight of a BlockSparseLinear of Sequential"):
        SparseOptimizer(objs, method="rigl", model=nn.Sequential(nn.Linear(2, 2)))
    so = SparseOptimizer(objs[:1], lr=0.25)
    with pytest.raises(ValueError, match="appear in more than one group"):
        so.add_param_group(dict(sparse_objects=objs[:1]))
    with pytest.raises(ValueError, match=r"unknown keys \['momentum'\]"):
        so.add_param_group(dict(sparse_objects=objs[1:], momentum=0.9))
    with pytest.raises(TypeError, match="expected a torch.optim.Optimizer, got list"):
        so.attach_optimizer([])
    so.attach_optimizer(torch.optim.Adam(objs[1].parameters()))  # does not hold objs[0]
    with pytest.raises(ValueError, match="are in none of the attached optimizers"):
        so.step()
    lonely = SparseOptimizer(objs[1:], lr=0.25)
    with pytest.warns(UserWarning, match="no optimizer attached"):
        lonely.step()
    rigl = SparseOptimizer(objs, lr=0.25, method="rigl", model=model)
    rigl.attach_optimizer(torch.optim.Adam(model.parameters()))
    with pytest.raises(ValueError, match="no dense gradient was recorded"):
        rigl.step()
    adagrad = torch.optim.Adagrad(model.parameters())
    train_steps(model, adagrad, steps=1)
    adagrad.state[objs[0].data]["odd"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"state 'odd' of Adagrad has shape \(3,\), not the blocks' shape"):
        move_optimizer_state(adagrad, objs[0].data, torch.arange(objs[0].nnz_blocks))


def test_sparse_optimizer_callback_with_the_trainer(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")

    model = MSEModel(make_model())
    so = SparseOptimizer(SparseOptimizer.sparse_objects(model), lr=0.25, method="rigl", model=model,
                         update_frequency=2)
    first = model.net[0].weight.block_mask().clone()
    args = trainer_args(transformers, tmp_path, max_steps=4, gradient_accumulation_steps=2)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=RegressionData(16),
                                   callbacks=[SparseOptimizerCallback(so)])
    trainer.train()
    assert so.step_count == 4
    optimizer = so.attached_optimizers[0]
    assert isinstance(optimizer, torch.optim.AdamW)  # the Trainer's, unwrapped from accelerate's wrapper
    assert any(p is model.net[0].weight.data for g in optimizer.param_groups for p in g["params"])
    assert not torch.equal(first, model.net[0].weight.block_mask())
    model.net[0].weight.validate()
    with pytest.raises(TypeError, match="sparse_optimizer must be a SparseOptimizer"):
        SparseOptimizerCallback(object())
