"""Demo: patch a small Llama-style causal LM by regex with BlockSparseModelPatcher and train it a few steps.

The model is built locally from a tiny transformers config (nothing is downloaded), reads bytes (vocabulary
of 256, so no tokenizer is needed) and learns on data/tiny_corpus.txt. The feed-forward projections
(gate_proj, up_proj, down_proj) of every layer become BlockSparseLinear layers keeping 50% of their blocks.

    python demo.py                       # defaults: finishes in well under 2 minutes on a 2-core CPU
    python demo.py --steps 200 --device cuda

Prints: the patch report, parameter counts dense vs sparse, the loss on held-out text before and after
training, the first and last training losses, the time per step, and a short greedy sample.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch

from pytorch_block_sparse_ng import BlockSparseLinear, BlockSparseModelPatcher, get_backend, kernels_available

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CORPUS = os.path.join(HERE, "data", "tiny_corpus.txt")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    parser.add_argument("--device", default="auto", help="auto (cuda when available, else cpu), cpu, cuda, cuda:1...")
    parser.add_argument("--density", type=float, default=0.5, help="fraction of blocks kept in the FFN layers")
    parser.add_argument("--block-shape", type=int, nargs=2, default=(32, 32), metavar=("ROWS", "COLS"))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", default=DEFAULT_CORPUS, help="a text file (read as UTF-8 bytes)")
    parser.add_argument("--sample-bytes", type=int, default=80, help="length of the greedy sample (0: none)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps={args.steps} must be at least 1")
    return args


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"demo.py: --device {name} asked for, but torch {torch.__version__} sees no CUDA GPU")
    return device


def load_bytes(path: str) -> torch.Tensor:
    with open(path, "rb") as handle:
        data = torch.frombuffer(bytearray(handle.read()), dtype=torch.uint8).long()
    if data.numel() < 1024:
        raise SystemExit(f"demo.py: {path} has {data.numel()} bytes; the demo needs at least 1024")
    return data


def build_model(args: argparse.Namespace):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=args.hidden_size, intermediate_size=4 * args.hidden_size,
                         num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=args.seq_len, tie_word_embeddings=False,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def batches(data: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator):
    """Random windows of seq_len bytes: (batch_size, seq_len) int64."""
    while True:
        starts = torch.randint(0, data.numel() - seq_len, (batch_size,), generator=generator)
        yield torch.stack([data[s:s + seq_len] for s in starts.tolist()])


@torch.no_grad()
def eval_loss(model, data: torch.Tensor, seq_len: int, device: torch.device) -> float:
    """Mean next-byte loss over consecutive windows of the held-out bytes."""
    model.eval()
    n = (data.numel() // seq_len) * seq_len
    windows = data[:n].view(-1, seq_len).to(device)
    loss = model(input_ids=windows, labels=windows).loss.item()
    model.train()
    return loss


@torch.no_grad()
def greedy_sample(model, prompt: str, length: int, seq_len: int, device: torch.device) -> str:
    model.eval()
    ids = torch.tensor([list(prompt.encode("utf-8"))], device=device)
    for _ in range(length):
        logits = model(input_ids=ids[:, -seq_len:]).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    model.train()
    return bytes(ids[0].tolist()).decode("utf-8", errors="replace")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> None:
    args = parse_args(argv)
    device = pick_device(args.device)
    torch.manual_seed(args.seed)

    data = load_bytes(args.corpus)
    split = int(0.9 * data.numel())
    train_data, held_out = data[:split], data[split:]

    model = build_model(args)
    dense_total = count_parameters(model)

    # The predecessor's way, with fullmatch rules: one rule per family of layers, [0-9]+ for the layer number.
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"model\.layers\.[0-9]+\.mlp\.(gate|up|down)_proj",
                        {"density": args.density, "block_shape": tuple(args.block_shape)})
    report = patcher.patch_model(model)
    model.to(device)
    sparse_total = count_parameters(model)

    print(f"torch {torch.__version__}, device {device}, backend {get_backend()!r}, "
          f"CUDA kernels {'built' if kernels_available() else 'not built (pure-PyTorch reference path)'}")
    print(f"corpus: {args.corpus} ({data.numel():,} bytes; {held_out.numel():,} held out)")
    print(report)
    n_sparse = sum(isinstance(m, BlockSparseLinear) for m in model.modules())
    print(f"parameters: dense model {dense_total:,} -> sparse model {sparse_total:,} "
          f"({sparse_total / dense_total:.1%}); the {n_sparse} patched layers: "
          f"{report.params_before:,} -> {report.params_after:,}")

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 10) * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
    generator = torch.Generator().manual_seed(args.seed)
    stream = batches(train_data, args.batch_size, args.seq_len, generator)

    loss_before = eval_loss(model, held_out, args.seq_len, device)
    model.train()
    losses, step_times = [], []
    for step in range(args.steps):
        ids = next(stream).to(device)
        synchronize(device)
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        synchronize(device)
        step_times.append(time.perf_counter() - start)
        losses.append(loss.item())
        if step == 0 or (step + 1) % 10 == 0 or step + 1 == args.steps:
            print(f"step {step + 1:4d}/{args.steps}  loss {losses[-1]:.3f}  {1000 * step_times[-1]:.1f} ms")
    loss_after = eval_loss(model, held_out, args.seq_len, device)

    timed = step_times[1:] or step_times  # the first step includes one-time warm-up
    print(f"training loss: first step {losses[0]:.3f}, last step {losses[-1]:.3f}")
    print(f"held-out loss: start {loss_before:.3f}, end {loss_after:.3f} "
          f"(uniform over 256 bytes: {math.log(256):.3f})")
    print(f"time per step: {1000 * sum(timed) / len(timed):.1f} ms "
          f"(batch {args.batch_size} x {args.seq_len} bytes, mean of {len(timed)} steps, {device})")
    if args.sample_bytes > 0:
        print("greedy sample: " + repr(greedy_sample(model, "The ", args.sample_bytes, args.seq_len, device)))


if __name__ == "__main__":
    main()
