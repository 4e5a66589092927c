# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Prune a BERT classifier to 2:4 and to blocks, recover, accelerate
#
# The flow of PyTorch's semi-structured (2:4) sparsity tutorial, on data that ships with this repository:
#
# 1. train a small BERT-style classifier (here from scratch: nothing is downloaded) — the dense baseline;
# 2. prune a copy to **2:4** and another to **blocks** (half of the 16×16 or 32×32 blocks) with
#    `pytorch_block_sparse_ng.prune_model(..., convert=False)`: masks held on the dense layers;
# 3. fine-tune each for a few steps to recover the accuracy lost by pruning;
# 4. convert the masked layers into accelerated ones (`convert_masked_model`: `SemiStructuredLinear`,
#    `BlockSparseLinear`), with the same outputs;
# 5. compare accuracy and inference speed; save and reload the sparse models.
#
# **The task**: `data/tiny_corpus.txt` holds 13 short texts on different subjects (a lighthouse, bread,
# bicycles, ...). Each example is a window of consecutive words; the label is the text it comes from. Windows for
# evaluation come from the last fifth of every text, which training never sees.
#
# Small defaults run on a CPU in a few minutes; `FULL = True` (default when a GPU is visible) uses a larger model.

# %% tags=["parameters"]
import torch

FULL = torch.cuda.is_available()
HIDDEN = 256 if FULL else 64
LAYERS = 4 if FULL else 2
BLOCK = 32 if FULL else 16                # block_shape for block pruning
DENSITY = 0.5                             # fraction of blocks kept by block pruning (2:4 keeps 0.5 too)
DENSE_STEPS = 1500 if FULL else 300       # training the dense baseline
RECOVER_STEPS = 300 if FULL else 60       # fine-tuning after pruning
WINDOW = 24                               # words per example
BATCH = 32
TIMING_REPEATS = 20                       # timed forward passes per model
OUTPUT_DIR = None                         # None: a temporary directory

# %%
import copy
import os
import statistics
import tempfile
import time

import matplotlib.pyplot as plt
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from tqdm.auto import tqdm
from transformers import (AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification,
                          PreTrainedTokenizerFast, Trainer, TrainingArguments)

import pytorch_block_sparse_ng as bs

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
out_dir = OUTPUT_DIR or tempfile.mkdtemp(prefix="bsng_02_")


def find_repo_file(relative):
    for root in (".", ".."):
        if os.path.exists(os.path.join(root, relative)):
            return os.path.join(root, relative)
    raise FileNotFoundError(relative)


print(f"pytorch_block_sparse_ng {bs.__version__}, torch {torch.__version__}, device {device}, FULL={FULL}")

# %% [markdown]
# ## 1. The data: which text does a window of words come from?

# %%
lines = open(find_repo_file("data/tiny_corpus.txt"), encoding="utf-8").read().split("\n")
sections, title = {}, None
for i, line in enumerate(lines):
    line = line.strip()
    is_title = line and not line.endswith((".", "!", "?", '"')) and (i + 1 >= len(lines) or not lines[i + 1].strip())
    if is_title and len(line.split()) <= 8:
        title = line
        sections[title] = []
    elif line and title is not None:
        sections[title] += line.split()
labels = list(sections)


def windows(words, stride):
    return [" ".join(words[i:i + WINDOW]) for i in range(0, len(words) - WINDOW + 1, stride)]


train_texts, train_labels, eval_texts, eval_labels = [], [], [], []
for label, words in enumerate(sections.values()):
    cut = int(len(words) * 0.8)
    for text in windows(words[:cut], stride=3):
        train_texts.append(text)
        train_labels.append(label)
    for text in windows(words[cut:], stride=WINDOW // 8):
        eval_texts.append(text)
        eval_labels.append(label)
print(f"{len(labels)} classes: {labels}")
print(f"{len(train_texts)} training windows, {len(eval_texts)} evaluation windows; chance = {1 / len(labels):.1%}")

# %% [markdown]
# A WordPiece tokenizer trained on the training part only.

# %%
wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
wordpiece.train_from_iterator(train_texts, trainers.WordPieceTrainer(vocab_size=3000, special_tokens=specials,
                                                                     show_progress=False))
wordpiece.post_processor = processors.TemplateProcessing(
    single="[CLS] $A [SEP]", special_tokens=[("[CLS]", wordpiece.token_to_id("[CLS]")),
                                             ("[SEP]", wordpiece.token_to_id("[SEP]"))])
tokenizer = PreTrainedTokenizerFast(tokenizer_object=wordpiece, unk_token="[UNK]", pad_token="[PAD]",
                                    cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
MAX_LEN = 48


def encode(texts, label_ids):
    enc = tokenizer(texts, padding="max_length", truncation=True, max_length=MAX_LEN, return_tensors="pt")
    return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
             "labels": torch.tensor(label_ids[i])} for i in range(len(texts))]


train_set, eval_set = encode(train_texts, train_labels), encode(eval_texts, eval_labels)
print(f"vocabulary {len(tokenizer)}; example: {tokenizer.tokenize(train_texts[0])[:12]} ...")

# %% [markdown]
# ## 2. The dense baseline

# %%
def fine_tune(model, steps, learning_rate, name):
    args = TrainingArguments(output_dir=os.path.join(out_dir, name), max_steps=steps, per_device_train_batch_size=BATCH,
                             learning_rate=learning_rate, warmup_steps=steps // 10, weight_decay=0.0,
                             lr_scheduler_type="linear", logging_steps=max(1, steps // 20), save_strategy="no",
                             report_to=[], seed=0, use_cpu=device == "cpu", dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=train_set)
    trainer.train()
    return [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]


@torch.no_grad()
def accuracy(model):
    model.eval()
    correct = 0
    for i in range(0, len(eval_set), 128):
        batch = eval_set[i:i + 128]
        inputs = {k: torch.stack([b[k] for b in batch]).to(device) for k in ("input_ids", "attention_mask")}
        predicted = model(**inputs).logits.argmax(-1).cpu()
        correct += int((predicted == torch.stack([b["labels"] for b in batch])).sum())
    return correct / len(eval_set)


config = BertConfig(vocab_size=len(tokenizer), hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                    num_attention_heads=max(2, HIDDEN // 64), intermediate_size=4 * HIDDEN,
                    max_position_embeddings=MAX_LEN, num_labels=len(labels), pad_token_id=tokenizer.pad_token_id)
dense = BertForSequenceClassification(config).to(device)
dense_curve = fine_tune(dense, DENSE_STEPS, 1e-3, "dense")
results = {"dense": {"one-shot": accuracy(dense)}}
print(f"dense accuracy: {results['dense']['one-shot']:.1%}")

# %% [markdown]
# ## 3. Prune: 2:4 and blocks, masks on the dense layers
#
# One rule matches the linear layers of every encoder layer (the classifier head and embeddings stay dense).
# `prune_model(..., convert=False)` chooses the masks by magnitude and holds them on the dense layers, so that
# fine-tuning keeps the pruned weights at zero.

# %%
ENCODER_LINEARS = (r"bert\.encoder\.layer\.[0-9]+\.(attention\.self\.(query|key|value)|attention\.output\.dense"
                   r"|intermediate\.dense|output\.dense)")
PATTERNS = {
    "2:4": {"sparsity": "2:4"},
    f"blocks {BLOCK}x{BLOCK}": {"density": DENSITY, "block_shape": (BLOCK, BLOCK)},
}
pruned = {}
for name, rule in PATTERNS.items():
    model = copy.deepcopy(dense)
    bs.prune_model(model, {ENCODER_LINEARS: rule}, convert=False, progress=False)
    pruned[name] = model
    results[name] = {"one-shot": accuracy(model)}
    print(f"{name}: accuracy right after pruning {results[name]['one-shot']:.1%} "
          f"(density of the pruned layers {bs.pruning.masked_density(model):.2f})")

# %% [markdown]
# ## 4. Fine-tune to recover, then convert to accelerated layers

# %%
curves = {}
for name, model in pruned.items():
    curves[name] = fine_tune(model, RECOVER_STEPS, 3e-4, name.replace(" ", "_").replace(":", "of"))
    results[name]["recovered"] = accuracy(model)
    report = bs.convert_masked_model(model)
    results[name]["converted"] = accuracy(model)
    kinds = sorted({type(r.new_module).__name__ for r in report})
    print(f"{name}: {len(report)} layers -> {kinds}; accuracy recovered {results[name]['recovered']:.1%}, "
          f"after conversion {results[name]['converted']:.1%}")
    assert results[name]["converted"] == results[name]["recovered"]  # conversion does not change the function

# %%
print(f"{'model':16}{'one-shot':>10}{'recovered':>11}{'converted':>11}")
for name, row in results.items():
    cells = [row.get(k) for k in ("one-shot", "recovered", "converted")]
    print(f"{name:16}" + "".join(f"{c:>10.1%} " if c is not None else f"{'':>11}" for c in cells))

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
left.plot(*zip(*dense_curve), label="dense training")
offset = dense_curve[-1][0]
for name, curve in curves.items():
    left.plot([offset + s for s, _ in curve], [loss for _, loss in curve], label=f"{name} recovery")
left.set_xlabel("step")
left.set_ylabel("training loss")
left.legend()
names = list(results)
right.bar([n + "\none-shot" for n in names[1:]] + ["dense"] + [n + "\nrecovered" for n in names[1:]],
          [results[n]["one-shot"] for n in names[1:]] + [results["dense"]["one-shot"]]
          + [results[n]["recovered"] for n in names[1:]])
right.axhline(1 / len(labels), color="k", linewidth=0.8, linestyle=":")
right.set_ylabel("evaluation accuracy")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 5. Inference speed
#
# On a CPU, `BlockSparseLinear` runs the pure-PyTorch reference path and `SemiStructuredLinear` a masked dense
# product: the numbers below show the cost of that path, not a speed-up. On a GPU (fp16) 2:4 layers use
# PyTorch's semi-structured sparse kernels where PyTorch supports the GPU, and block-sparse layers the
# package's kernels when they are built (`kernels_available()`). At the small default sizes fixed per-call
# costs dominate and sparse layers are slower than dense ones on any device; gains need large layers and large
# batches (doc/performance.md has the kernel measurements, when there are any).

# %%
def time_inference(models, repeats=TIMING_REPEATS):
    """Median milliseconds per forward pass of each model. The models take turns (one pass each per round), so
    that a slow spell of a shared machine hits them all alike; warm-up passes first."""
    batch = {k: torch.stack([b[k] for b in eval_set[:BATCH]]).to(device) for k in ("input_ids", "attention_mask")}
    dtype = torch.float16 if device == "cuda" else torch.float32
    for model in models.values():
        model.eval().to(dtype)
    times = {name: [] for name in models}
    with torch.no_grad():
        for round_ in tqdm(range(repeats + 3), desc="timing"):
            for name, model in models.items():
                if device == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                model(**batch)
                if device == "cuda":
                    torch.cuda.synchronize()
                if round_ >= 3:
                    times[name].append((time.perf_counter() - start) * 1e3)
    for model in models.values():
        model.float()
    return {name: statistics.median(values) for name, values in times.items()}


where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
timings = time_inference({"dense": dense, **pruned})
for name, ms in timings.items():
    print(f"{where}: {name:16} {ms:8.2f} ms per batch of {BATCH} ({timings['dense'] / ms:.2f}x dense)")
print(f"block-sparse kernels available: {bs.kernels_available()}")

# %% [markdown]
# ## 6. Save and reload the sparse models

# %%
for name, model in pruned.items():
    path = os.path.join(out_dir, "saved_" + name.replace(" ", "_").replace(":", "of"))
    model.save_pretrained(path)
    reloaded = bs.from_pretrained(AutoModelForSequenceClassification, path).to(device)
    same = accuracy(reloaded) == results[name]["converted"]
    batch = {k: torch.stack([b[k] for b in eval_set[:8]]).to(device) for k in ("input_ids", "attention_mask")}
    saved, loaded = model.state_dict(), reloaded.state_dict()
    same = same and saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    with torch.no_grad():
        difference = (model.eval()(**batch).logits - reloaded.eval()(**batch).logits).abs().max().item()
    layer = reloaded.bert.encoder.layer[0].intermediate.dense
    print(f"{name}: reloaded as {type(layer).__name__}, same accuracy and every tensor bit-identical: {same}; "
          f"largest output difference: {difference:.2g}")
    assert same and difference <= 1e-5  # 0 on a CPU; a GPU may sum in another order
