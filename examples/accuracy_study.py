"""Accuracy study: dense vs 2:4 pruned + fine-tuned vs block density 0.5 trained from scratch (static pattern,
SET-like random regrowth, RigL gradient regrowth), on a character-level language model of
data/tiny_corpus.txt.

The model is a tiny pre-LayerNorm GPT written in plain PyTorch (character vocabulary, learned positions); every
linear layer inside the transformer blocks (attention qkv and output projection, MLP fc1 and fc2) is pruned /
made sparse, the embedding and the output head stay dense. The last 10% of the corpus is held out; the metric
is the mean cross-entropy on all held-out windows (nats per character; bits = nats / ln 2).

Runs, all with the same optimizer (AdamW, cosine learning rate) and, for the from-scratch runs, the same number
of steps S:
    dense             S steps
    dense + fine-tune the dense model trained F more steps like the fine-tunes below (a control)
    2:4 one-shot      the dense model pruned to 2:4 by magnitude (and by Wanda), no fine-tune
    2:4 + fine-tune   the masked model fine-tuned F more steps, then converted to SemiStructuredLinear
    2:4 transposable  the same with a transposable 2:4 mask (W and Wᵀ both 2:4), by |W|
    block static      BlockSparseLinear at density 0.5 from scratch, fixed random pattern, S steps
    block SET         same, with SparseOptimizer(method="magnitude") regrowing at random positions
    block RigL        same, with SparseOptimizer(method="rigl") regrowing where the dense gradient is largest

    python examples/accuracy_study.py                 # defaults: a few minutes on a 2-core CPU
    python examples/accuracy_study.py --seeds 0 1 2 --steps 1200
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

import regex

from pytorch_block_sparse_ng import (BlockSparseModelPatcher, SparseOptimizer, compare_transposable,
                                     convert_masked_model, prune_model)

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, os.pardir, "data", "tiny_corpus.txt")
magnitude = {}  # seed -> kept-magnitude comparison of plain vs transposable 2:4 on the trained dense weights
SPARSE_LAYERS = r"blocks\.[0-9]+\.(attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)"


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.dropout = dropout

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.attn.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = self.attn.proj(y.transpose(1, 2).reshape(b, t, d))
        x = x + F.dropout(y, self.dropout, self.training)
        y = self.mlp.fc2(F.gelu(self.mlp.fc1(self.ln2(x))))
        return x + F.dropout(y, self.dropout, self.training)


class CharGPT(nn.Module):
    def __init__(self, vocab: int, d: int = 128, layers: int = 2, heads: int = 4, context: int = 64,
                 dropout: float = 0.1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList([Block(d, heads, dropout) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def load_data(path: str):
    text = open(path, encoding="utf-8").read()
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    split = int(0.9 * len(ids))
    return ids[:split], ids[split:], len(chars)


def batch(data, batch_size, context, gen):
    start = torch.randint(0, len(data) - context - 1, (batch_size,), generator=gen)
    x = torch.stack([data[s:s + context] for s in start.tolist()])
    y = torch.stack([data[s + 1:s + context + 1] for s in start.tolist()])
    return x, y


@torch.no_grad()
def evaluate(model, data, context):
    """Mean cross-entropy (nats/char) over non-overlapping held-out windows."""
    model.eval()
    n = (len(data) - 1) // context
    x = data[:n * context].view(n, context)
    y = data[1:n * context + 1].view(n, context)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum") / y.numel()
    model.train()
    return float(loss)


def train(model, train_data, steps, args, seed, lr=None, sparse_optimizer=None, make_so=None):
    """AdamW with warmup + cosine decay; ``make_so(optimizer)`` builds a SparseOptimizer attached to it."""
    lr = lr or args.lr
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=args.weight_decay, betas=(0.9, 0.99))
    so = make_so(optimizer) if make_so else None
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda t: min(1.0, (t + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(t, steps) / steps)))
    gen = torch.Generator().manual_seed(1000 + seed)
    model.train()
    for _ in range(steps):
        x, y = batch(train_data, args.batch_size, args.context, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        if so is not None:
            so.step()
    return model


def sparse_from_scratch(vocab, args, seed):
    torch.manual_seed(seed)
    model = CharGPT(vocab, args.d, args.layers, args.heads, args.context, args.dropout)
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(SPARSE_LAYERS, dict(density=args.density, block_shape=tuple(args.block_shape), init="random"))
    patcher.patch_model(model)
    return model


def run_seed(seed, args, train_data, val_data, vocab, log):
    results = {}
    t0 = time.time()
    torch.manual_seed(seed)
    dense = CharGPT(vocab, args.d, args.layers, args.heads, args.context, args.dropout)
    train(dense, train_data, args.steps, args, seed)
    results["dense"] = evaluate(dense, val_data, args.context)
    log(f"seed {seed} dense: {results['dense']:.4f} ({time.time() - t0:.0f}s)")

    control = copy.deepcopy(dense)  # the same extra steps without pruning: what fine-tuning alone gives
    train(control, train_data, args.finetune_steps, args, seed + 1, lr=args.finetune_lr)
    results["dense + fine-tune (control)"] = evaluate(control, val_data, args.context)

    calib_gen = torch.Generator().manual_seed(7)
    calibration = [batch(train_data, args.batch_size, args.context, calib_gen)[0] for _ in range(4)]
    for score in ("l2", "wanda"):
        model = copy.deepcopy(dense)
        prune_model(model, {SPARSE_LAYERS: {"sparsity": "2:4"}}, score=score, calibration=calibration, convert=True,
                    progress=False)
        results[f"2:4 one-shot ({score})"] = evaluate(model, val_data, args.context)
        model = copy.deepcopy(dense)
        prune_model(model, {SPARSE_LAYERS: {"sparsity": "2:4"}}, score=score, calibration=calibration, convert=False,
                    progress=False)
        train(model, train_data, args.finetune_steps, args, seed + 1, lr=args.finetune_lr)
        convert_masked_model(model)  # SemiStructuredLinear layers, same outputs as the masked model
        results[f"2:4 + fine-tune ({score})"] = evaluate(model, val_data, args.context)
    model = copy.deepcopy(dense)
    prune_model(model, {SPARSE_LAYERS: {"sparsity": "2:4", "transposable": True}}, score="l1", convert=False,
                progress=False)
    results["2:4 transposable one-shot (l1)"] = evaluate(model, val_data, args.context)
    train(model, train_data, args.finetune_steps, args, seed + 1, lr=args.finetune_lr)
    convert_masked_model(model)
    results["2:4 transposable + fine-tune (l1)"] = evaluate(model, val_data, args.context)
    kept = [compare_transposable(module.weight) for name, module in dense.named_modules()
            if regex.fullmatch(SPARSE_LAYERS, name)]
    magnitude[seed] = {key: sum(k[key] for k in kept) / len(kept) for key in ("plain", "transposable", "ratio")}
    log(f"seed {seed} 2:4: " + ", ".join(f"{k} {v:.4f}" for k, v in results.items() if k.startswith("2:4")))
    log(f"seed {seed} kept |W| (mean over the sparse layers of the dense model): plain 2:4 "
        f"{magnitude[seed]['plain']:.4f}, transposable {magnitude[seed]['transposable']:.4f}, ratio "
        f"{magnitude[seed]['ratio']:.4f}")

    schedule_steps = int(0.75 * args.steps)
    for name, method in (("block static", None), ("block SET", "magnitude"), ("block RigL", "rigl")):
        t1 = time.time()
        model = sparse_from_scratch(vocab, args, seed)

        def make_so(optimizer, method=method, model=model):
            so = SparseOptimizer(SparseOptimizer.sparse_objects(model), lr=args.drop_fraction, method=method,
                                 model=model, drop_schedule="cosine", total_steps=schedule_steps,
                                 update_frequency=args.update_frequency,
                                 generator=torch.Generator().manual_seed(seed))
            so.attach_optimizer(optimizer)
            return so

        train(model, train_data, args.steps, args, seed, make_so=make_so if method else None)
        results[name] = evaluate(model, val_data, args.context)
        log(f"seed {seed} {name}: {results[name]:.4f} ({time.time() - t1:.0f}s)")
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default=CORPUS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=1000, help="training steps of the from-scratch runs")
    parser.add_argument("--finetune-steps", type=int, default=250, help="fine-tune steps after 2:4 pruning")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--finetune-lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--density", type=float, default=0.5)
    parser.add_argument("--block-shape", type=int, nargs=2, default=(16, 16))
    parser.add_argument("--drop-fraction", type=float, default=0.3, help="initial fraction of blocks replaced")
    parser.add_argument("--update-frequency", type=int, default=25, help="steps between pattern updates")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    train_data, val_data, vocab = load_data(args.corpus)
    print(f"corpus: {len(train_data)} train / {len(val_data)} held-out characters, vocabulary {vocab}")
    print(f"model: d={args.d}, layers={args.layers}, context={args.context}; sparse layers: {SPARSE_LAYERS}; "
          f"blocks {tuple(args.block_shape)} at density {args.density}; {args.steps} steps of batch "
          f"{args.batch_size}x{args.context}, 2:4 fine-tune {args.finetune_steps} steps")
    all_results = [run_seed(seed, args, train_data, val_data, vocab, print) for seed in args.seeds]
    names = list(all_results[0])
    dense = sum(r["dense"] for r in all_results) / len(all_results)
    print(f"\n| run | held-out loss (nats/char) | bits/char | vs dense |\n|---|---|---|---|")
    summary = {}
    for name in names:
        values = [r[name] for r in all_results]
        mean = sum(values) / len(values)
        spread = f" ± {(max(values) - min(values)) / 2:.3f}" if len(values) > 1 else ""
        summary[name] = dict(mean=mean, values=values, relative=mean / dense - 1)
        print(f"| {name} | {mean:.4f}{spread} | {mean / math.log(2):.3f} | {100 * (mean / dense - 1):+.2f} % |")
    for seed, kept in magnitude.items():
        print(f"seed {seed}: transposable 2:4 keeps {kept['ratio']:.4f} of the |W| a plain 2:4 mask keeps "
              f"({kept['transposable']:.4f} vs {kept['plain']:.4f} of the total)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(dict(args=vars(args), results=summary, kept_magnitude=magnitude), handle, indent=2)


if __name__ == "__main__":
    main()
