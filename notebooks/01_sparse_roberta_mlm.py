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
# # 01 · Train a sparse RoBERTa masked-LM from scratch
#
# The predecessor's notebook, done with `pytorch_block_sparse_ng`:
#
# 1. train a byte-level BPE tokenizer on text that ships with the repository (`data/tiny_corpus.txt`);
# 2. build a RoBERTa masked-LM from a config and make its feed-forward and attention-output layers
#    block-sparse with `BlockSparseModelPatcher` (regex rules on layer names);
# 3. count parameters, dense against sparse;
# 4. train with 🤗 `Trainer` and plot the loss;
# 5. time dense against sparse on a GPU (when there is one);
# 6. save with `save_pretrained` and reload the *sparse* model with `pytorch_block_sparse_ng.from_pretrained`.
#
# The defaults are tiny so that the notebook runs on a laptop CPU in a few minutes. `FULL = True` (the default
# when a GPU is visible) trains a larger model for longer. Nothing is downloaded.

# %% tags=["parameters"]
import torch

FULL = torch.cuda.is_available()          # larger model and more steps on a GPU
MAX_STEPS = 400 if FULL else 100          # optimizer steps
HIDDEN = 512 if FULL else 128
LAYERS = 6 if FULL else 2
BLOCK = 32 if FULL else 16                # block_shape = (BLOCK, BLOCK)
DENSITY = 0.25                            # fraction of blocks kept in the patched layers
SEQ_LEN = 64
BATCH = 32 if FULL else 16
VOCAB = 2000
CORPUS = "data/tiny_corpus.txt"           # any UTF-8 text file; paragraphs are lines
OUTPUT_DIR = None                         # None: a temporary directory

# %%
import math
import os
import tempfile
import time

import matplotlib.pyplot as plt
from tokenizers import ByteLevelBPETokenizer
from transformers import (DataCollatorForLanguageModeling, PreTrainedTokenizerFast, RobertaConfig,
                          RobertaForMaskedLM, Trainer, TrainingArguments)

import pytorch_block_sparse_ng as bs

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
out_dir = OUTPUT_DIR or tempfile.mkdtemp(prefix="bsng_01_")


def find_repo_file(relative):
    """The notebook runs from notebooks/ or from the repository root."""
    for root in (".", ".."):
        if os.path.exists(os.path.join(root, relative)):
            return os.path.join(root, relative)
    raise FileNotFoundError(relative)


print(f"pytorch_block_sparse_ng {bs.__version__}, torch {torch.__version__}, device {device}, FULL={FULL}")

# %% [markdown]
# ## 1. A tokenizer trained on the repository's text
#
# Paragraphs of `data/tiny_corpus.txt` (20 KB); the last tenth is held out for evaluation. A corpus this small
# is enough to see the model learn, not to pre-train it: with more steps or a larger model the training loss
# keeps falling while the evaluation loss rises (the model memorises the text). Point `CORPUS` at a larger text
# file for real pre-training.

# %%
text = open(CORPUS if os.path.exists(CORPUS) else find_repo_file(CORPUS), encoding="utf-8").read()
paragraphs = [p.strip() for p in text.split("\n") if len(p.strip()) > 40]
split = int(len(paragraphs) * 0.9)
train_paragraphs, eval_paragraphs = paragraphs[:split], paragraphs[split:]

special = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
bpe = ByteLevelBPETokenizer()
bpe.train_from_iterator(train_paragraphs, vocab_size=VOCAB, min_frequency=2, special_tokens=special,
                        show_progress=False)
tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                    unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
print(f"{len(paragraphs)} paragraphs, vocabulary {len(tokenizer)} tokens")
print(tokenizer.tokenize("The lighthouse keeper counted the stairs."))

# %%
def chunks(paragraph_list):
    """Concatenate the token ids (with </s> between paragraphs) and cut into SEQ_LEN-token examples."""
    ids = []
    for paragraph in paragraph_list:
        ids += tokenizer(paragraph)["input_ids"] + [tokenizer.eos_token_id]
    return [{"input_ids": ids[i:i + SEQ_LEN]} for i in range(0, len(ids) - SEQ_LEN + 1, SEQ_LEN // 2)]


train_set, eval_set = chunks(train_paragraphs), chunks(eval_paragraphs)
collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=True, mlm_probability=0.15)
print(f"{len(train_set)} training and {len(eval_set)} evaluation examples of {SEQ_LEN} tokens")

# %% [markdown]
# ## 2. A RoBERTa masked-LM, patched by regex
#
# The rules are fullmatched against the qualified layer names (`model.named_modules()`); each matching
# `nn.Linear` becomes a `BlockSparseLinear`. `init="random"` draws a fresh random pattern and values scaled
# for the density — what you want for training from scratch (`"magnitude"`, the default, keeps the largest
# blocks of a *trained* layer with their values).

# %%
config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                       num_attention_heads=max(2, HIDDEN // 64), intermediate_size=4 * HIDDEN,
                       max_position_embeddings=SEQ_LEN + 4, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
dense_model = RobertaForMaskedLM(config)
model = RobertaForMaskedLM(config)

patcher = bs.BlockSparseModelPatcher()
for rule in (r"roberta\.encoder\.layer\.[0-9]+\.intermediate\.dense",
             r"roberta\.encoder\.layer\.[0-9]+\.output\.dense",
             r"roberta\.encoder\.layer\.[0-9]+\.attention\.output\.dense"):
    patcher.add_pattern(rule, {"density": DENSITY, "block_shape": (BLOCK, BLOCK), "init": "random"})
report = patcher.patch_model(model)
print(report)

# %% [markdown]
# ## 3. Parameters, dense against sparse

# %%
def count(m):
    return sum(p.numel() for p in m.parameters())


dense_count, sparse_count = count(dense_model), count(model)
print(f"{'':28}{'dense':>12}{'sparse':>12}")
print(f"{'patched layers':28}{report.params_before:>12,}{report.params_after:>12,}")
print(f"{'whole model':28}{dense_count:>12,}{sparse_count:>12,}")
print(f"the sparse model has {sparse_count / dense_count:.1%} of the dense model's parameters "
      f"(the embeddings and attention projections stay dense)")

# %% [markdown]
# ## 4. Training with `Trainer`
#
# bf16 autocast on GPUs that support it (the sparse layers follow autocast like `nn.Linear`); fp32 on CPU.

# %%
bf16 = device == "cuda" and torch.cuda.is_bf16_supported()
args = TrainingArguments(output_dir=os.path.join(out_dir, "trainer"), max_steps=MAX_STEPS,
                         per_device_train_batch_size=BATCH, learning_rate=1e-3 if not FULL else 5e-4,
                         warmup_steps=MAX_STEPS // 10, weight_decay=0.01, lr_scheduler_type="linear",
                         logging_steps=max(1, MAX_STEPS // 50), eval_strategy="steps",
                         eval_steps=max(1, MAX_STEPS // 5), per_device_eval_batch_size=BATCH, bf16=bf16,
                         use_cpu=device == "cpu", save_strategy="no", report_to=[], seed=0,
                         dataloader_num_workers=0)
trainer = Trainer(model=model, args=args, train_dataset=train_set, eval_dataset=eval_set, data_collator=collator)
trainer.train()
# With mixed precision, Trainer leaves an autocast wrapper around model.forward: take it off, so that the model
# below computes in its own dtype.
model = trainer.accelerator.unwrap_model(model, keep_fp32_wrapper=False)

# %%
history = trainer.state.log_history
train_points = [(h["step"], h["loss"]) for h in history if "loss" in h]
eval_points = [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h]
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(*zip(*train_points), label="training loss")
ax.plot(*zip(*eval_points), marker="o", label="evaluation loss")
ax.set_xlabel("step")
ax.set_ylabel("masked-LM loss")
ax.set_title(f"sparse RoBERTa (density {DENSITY}, blocks {BLOCK}x{BLOCK})")
ax.legend()
plt.show()
print(f"training loss {train_points[0][1]:.3f} -> {train_points[-1][1]:.3f}; "
      f"evaluation loss {eval_points[-1][1]:.3f} (perplexity {math.exp(eval_points[-1][1]):.1f})")

# %% [markdown]
# ## 5. Speed, dense against sparse
#
# Only meaningful on a GPU: on a CPU the block-sparse layers run the pure-PyTorch reference path, which is
# correct but not faster than dense. (`doc/performance.md` has the kernel benchmarks.)

# %%
def time_training_step(m, batch, repeats=10):
    m.train()
    optimizer = torch.optim.SGD(m.parameters(), lr=0.0)
    for i in range(repeats + 3):
        if i == 3:
            torch.cuda.synchronize()
            start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = m(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


if device == "cuda":
    batch = {k: v.to(device) for k, v in collator(train_set[:BATCH]).items()}
    dense_ms = time_training_step(dense_model.to(device), batch)
    sparse_ms = time_training_step(model.to(device), batch)
    print(f"{torch.cuda.get_device_name()}: training step dense {dense_ms:.2f} ms, sparse {sparse_ms:.2f} ms "
          f"(kernels: {bs.kernels_available()})")
    dense_model.cpu()
else:
    print("no GPU visible: speed not measured (the CPU path is the reference implementation)")

# %% [markdown]
# ## 6. Save and reload, still sparse
#
# `BlockSparseModelPatcher` recorded the sparse layout in `model.config`, so `save_pretrained` writes it to
# `config.json` next to `model.safetensors` (kept blocks and their int32 indices). Plain
# `RobertaForMaskedLM.from_pretrained` would build *dense* layers and initialise them randomly;
# `pytorch_block_sparse_ng.from_pretrained` rebuilds the sparse layers and loads them, checked.

# %%
save_dir = os.path.join(out_dir, "sparse-roberta")
model.save_pretrained(save_dir)
tokenizer.save_pretrained(save_dir)
print(sorted(os.listdir(save_dir)))

from transformers import AutoModelForMaskedLM  # noqa: E402

reloaded = bs.from_pretrained(AutoModelForMaskedLM, save_dir).to(device).eval()
model.eval()
saved, loaded = model.state_dict(), reloaded.state_dict()
same_tensors = saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
sample = collator(eval_set[:4])["input_ids"].to(device)
with torch.no_grad():
    difference = (model(sample).logits - reloaded(sample).logits).abs().max().item()
print(f"reloaded layers: {type(reloaded.roberta.encoder.layer[0].intermediate.dense).__name__}; "
      f"every tensor bit-identical: {same_tensors}; largest output difference: {difference:.2g}")
# On a CPU the outputs are bit-identical too; on a GPU the order of floating-point additions may vary by run.
assert same_tensors and difference <= 1e-5

# %%
sentence = "The keeper climbed the <mask> to the lamp room."
inputs = tokenizer(sentence, return_tensors="pt").to(device)
with torch.no_grad():
    scores = reloaded(**inputs).logits[0, inputs["input_ids"][0] == tokenizer.mask_token_id]
print(sentence, "->", [tokenizer.decode([i]).strip() for i in scores[0].topk(5).indices.tolist()])
