"""BlockSparseLinear under DistributedDataParallel (gloo, 2 CPU processes) and torch.compile."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pytorch_block_sparse_ng import BlockSparseLinear

from conftest import dtype_tols


def _ddp_worker(rank: int, world_size: int, init_file: str, result_dir: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        # Each rank builds the layer from another seed: DDP must broadcast rank 0's values and pattern.
        layer = BlockSparseLinear(64, 32, density=0.5, block_shape=(16, 16),
                                  generator=torch.Generator().manual_seed(100 + rank))
        model = torch.nn.parallel.DistributedDataParallel(layer)
        x = torch.randn(4, 64, generator=torch.Generator().manual_seed(rank))
        model(x).pow(2).sum().backward()
        torch.save({"x": x, "state": layer.state_dict(), "grad": layer.weight.data.grad,
                    "bias_grad": layer.bias.grad}, os.path.join(result_dir, f"rank{rank}.pt"))
        # Both ranks leave together: a rank tearing gloo down while its peer still talks to it aborted once
        # (SIGABRT, "terminate called without an active exception") on a loaded 2-core machine.
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
def test_ddp_broadcasts_the_pattern_and_averages_block_gradients(tmp_path):
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    state0, state1 = results[0]["state"], results[1]["state"]
    for name in state0:
        assert torch.equal(state0[name], state1[name]), f"{name} differs between ranks"
    # Expected: the mean over ranks of each rank's local gradient, computed here in one process.
    layer = BlockSparseLinear(64, 32, density=0.5, block_shape=(16, 16))
    layer.load_state_dict(state0)
    grads, bias_grads = [], []
    for result in results:
        layer.zero_grad()
        layer(result["x"]).pow(2).sum().backward()
        grads.append(layer.weight.data.grad.clone())
        bias_grads.append(layer.bias.grad.clone())
    for result in results:
        torch.testing.assert_close(result["grad"], sum(grads) / 2, **dtype_tols(torch.float32))
        torch.testing.assert_close(result["bias_grad"], sum(bias_grads) / 2, **dtype_tols(torch.float32))


def test_torch_compile_traces_forward_and_backward_without_graph_breaks():
    layer = BlockSparseLinear(128, 64, density=0.5, block_shape=(32, 32), generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 5, 128, requires_grad=True)
    x_eager = x.detach().clone().requires_grad_()
    y = compiled(x)
    y.sum().backward()
    grad_data = layer.weight.data.grad.clone()
    layer.zero_grad()
    y_eager = layer(x_eager)
    y_eager.sum().backward()
    torch.testing.assert_close(y, y_eager, **dtype_tols(torch.float32))
    torch.testing.assert_close(x.grad, x_eager.grad, **dtype_tols(torch.float32))
    torch.testing.assert_close(grad_data, layer.weight.data.grad, **dtype_tols(torch.float32))
