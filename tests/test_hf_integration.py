"""Hugging Face integration: save_pretrained / from_pretrained of patched models (safetensors, layout in
config.json, strict checks), and transformers' Trainer on patched models (bf16 autocast on CPU, fp16 on CUDA,
gradient checkpointing, gradient accumulation, the loss going down). Tiny models built from configs; nothing is
downloaded."""

import json
import os

import pytest
import torch

import pytorch_block_sparse_ng as bs
from pytorch_block_sparse_ng import BlockSparseLinear, BlockSparseModelPatcher, SemiStructuredLinear

transformers = pytest.importorskip("transformers", reason="the HF integration tests need transformers (the 'test' "
                                                          "extra)")
from safetensors.torch import load_file, save_file  # noqa: E402  (a dependency of transformers)

VOCAB = 256  # byte-level: data/tiny_corpus.txt needs no tokenizer
CORPUS = os.path.join(os.path.dirname(__file__), "..", "data", "tiny_corpus.txt")


def tiny_roberta():
    config = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=128, max_position_embeddings=40, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0, pad_token_id=1, bos_token_id=0,
                                        eos_token_id=2)
    return transformers.RobertaForMaskedLM(config)


def tiny_llama():
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.LlamaForCausalLM(config)


def tiny_gpt2():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=2, n_positions=64,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


# Block-sparse and 2:4 rules in one model; GPT-2's Conv1D layers included (a 2:4 layer stores (out, in) where a
# Conv1D has (in, out): the loader must not take the dense layer's view of it).
MODELS = {
    "roberta": (tiny_roberta, transformers.AutoModelForMaskedLM, {
        r"roberta\.encoder\.layer\.[0-9]+\.intermediate\.dense": {"density": 0.5, "block_shape": (16, 16)},
        r"roberta\.encoder\.layer\.[0-9]+\.output\.dense": {"density": 0.25, "block_shape": (16, 32)},
        r"roberta\.encoder\.layer\.[0-9]+\.attention\.output\.dense": {"sparsity": "2:4"}}),
    "llama": (tiny_llama, transformers.AutoModelForCausalLM, {
        r"model\.layers\.[0-9]+\.mlp\.(gate|up)_proj": {"density": 0.5, "block_shape": (16, 16)},
        r"model\.layers\.[0-9]+\.mlp\.down_proj": {"sparsity": "2:4"}}),
    "gpt2": (tiny_gpt2, transformers.AutoModelForCausalLM, {
        r"transformer\.h\.[0-9]+\.attn\.c_attn": {"sparsity": "2:4"},
        r"transformer\.h\.[0-9]+\.mlp\.c_fc": {"density": 0.5, "block_shape": (16, 16)},
        r"transformer\.h\.[0-9]+\.(attn|mlp)\.c_proj": {"density": 0.5, "block_shape": (32, 16)}}),
}


def build(kind: str, seed: int = 0, patched: bool = True):
    torch.manual_seed(seed)
    model = MODELS[kind][0]().eval()
    if patched:
        patcher = BlockSparseModelPatcher()
        for rule, info in MODELS[kind][2].items():
            patcher.add_pattern(rule, dict(info))
        patcher.patch_model(model)
        with torch.no_grad():  # values a fresh magnitude patch would not give back
            for module in model.modules():
                if isinstance(module, (BlockSparseLinear, SemiStructuredLinear)):
                    for p in module.parameters():
                        p.mul_(1.5)
    return model


def ids(seed: int = 3, batch: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model, tokens=None):
    with torch.no_grad():
        return model(tokens if tokens is not None else ids()).logits


def sparse_types(model) -> dict:
    return {name: type(m) for name, m in model.named_modules() if isinstance(m, (BlockSparseLinear,
                                                                                SemiStructuredLinear))}


# ------------------------------------------------------------------------------------------------ save / load
@pytest.mark.parametrize("kind", list(MODELS))
def test_save_pretrained_then_from_pretrained_is_bit_identical(kind, tmp_path):
    model = build(kind)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    recorded = json.loads((tmp_path / "config.json").read_text())["pytorch_block_sparse_ng"]
    assert set(recorded["layers"]) == set(sparse_types(model))

    loaded = bs.from_pretrained(MODELS[kind][1], tmp_path)  # an Auto class
    assert sparse_types(loaded) == sparse_types(model)
    assert not loaded.training
    for name, module in model.named_modules():
        if isinstance(module, BlockSparseLinear):
            other = loaded.get_submodule(name)
            assert other.block_shape == module.block_shape
            assert torch.equal(other.weight.block_mask(), module.weight.block_mask())
    assert torch.equal(logits(loaded), logits(model))
    # Saved again, loaded again: the layout travels on.
    loaded.save_pretrained(tmp_path / "again")
    assert torch.equal(logits(bs.from_pretrained(type(model), tmp_path / "again")), logits(model))


def test_layout_in_config_json_names_kind_block_shape_and_counts(tmp_path):
    model = build("gpt2")
    model.save_pretrained(tmp_path)
    layers = json.loads((tmp_path / "config.json").read_text())["pytorch_block_sparse_ng"]["layers"]
    assert layers["transformer.h.0.mlp.c_fc"] == dict(kind="block", in_features=64, out_features=256, bias=True,
                                                      block_shape=[16, 16], nnz_blocks=32, density=0.5,
                                                      replaces="Conv1D")
    assert layers["transformer.h.1.attn.c_attn"]["kind"] == "semi_structured"
    assert layers["transformer.h.1.attn.c_attn"]["sparsity"] == "2:4"
    tensors = load_file(tmp_path / "model.safetensors")
    assert tensors["transformer.h.0.mlp.c_fc.weight.data"].shape == (32, 16, 16)
    assert tensors["transformer.h.0.mlp.c_fc.weight.col_indices"].dtype == torch.int32


def test_plain_transformers_loading_is_not_sparse(tmp_path):
    """Why from_pretrained exists: transformers alone builds dense layers and reports their weights missing."""
    model = build("roberta")
    model.save_pretrained(tmp_path)
    plain, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not sparse_types(plain)
    assert "roberta.encoder.layer.0.intermediate.dense.weight" in info["missing_keys"]


def test_base_model_from_a_checkpoint_with_a_head(tmp_path):
    model = build("roberta")
    model.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="outside the sparse layers"):  # lm_head unused, pooler new
        base = bs.from_pretrained(transformers.AutoModel, tmp_path)
    assert "encoder.layer.0.intermediate.dense" in sparse_types(base)
    with torch.no_grad():
        assert torch.equal(base(ids()).last_hidden_state, model.roberta(ids()).last_hidden_state)


def test_patching_the_base_model_of_a_model_with_a_head(tmp_path):
    """Rules applied to model.roberta record names relative to it, in the config both share."""
    model = build("roberta", patched=False)
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"encoder\.layer\.[0-9]+\.intermediate\.dense", {"density": 0.5, "block_shape": (16, 16)})
    patcher.patch_model(model.roberta)
    assert list(model.config.pytorch_block_sparse_ng["layers"])[0] == "encoder.layer.0.intermediate.dense"
    model.save_pretrained(tmp_path)
    loaded = bs.from_pretrained(transformers.AutoModelForMaskedLM, tmp_path)
    assert list(sparse_types(loaded)) == ["roberta.encoder.layer.0.intermediate.dense",
                                          "roberta.encoder.layer.1.intermediate.dense"]
    assert torch.equal(logits(loaded), logits(model))


@pytest.mark.filterwarnings("ignore:.*outside the sparse layers:UserWarning")  # the dense lm_head parts, the pooler
def test_sparse_head_not_in_the_loaded_model_is_left_out_with_a_warning(tmp_path):
    model = build("roberta")
    patcher = BlockSparseModelPatcher()
    patcher.add_pattern(r"lm_head\.dense", {"density": 0.5, "block_shape": (16, 16)})
    patcher.patch_model(model)
    model.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=r"does not have were not used: \['lm_head.dense'\]"):
        base = bs.from_pretrained(transformers.AutoModel, tmp_path)
    assert "encoder.layer.0.intermediate.dense" in sparse_types(base)
    assert "lm_head.dense" not in base.config.pytorch_block_sparse_ng["layers"]
    with torch.no_grad():
        assert torch.equal(base(ids()).last_hidden_state, model.roberta(ids()).last_hidden_state)


def test_sharded_checkpoint(tmp_path):
    model = build("llama")
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert torch.equal(logits(bs.from_pretrained(transformers.AutoModelForCausalLM, tmp_path)), logits(model))


def test_dtype_argument_casts_values_and_keeps_int32_indices(tmp_path):
    model = build("llama")
    model.save_pretrained(tmp_path)
    loaded = bs.from_pretrained(transformers.AutoModelForCausalLM, tmp_path, dtype=torch.bfloat16)
    layer = loaded.model.layers[0].mlp.up_proj
    assert layer.weight.data.dtype == torch.bfloat16 and layer.weight.col_indices.dtype == torch.int32
    assert loaded.model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16
    torch.testing.assert_close(logits(loaded).float(), logits(model), rtol=0.1, atol=0.15)


def test_output_loading_info_lists_only_keys_outside_the_sparse_layers(tmp_path):
    build("roberta").save_pretrained(tmp_path)
    _, info = bs.from_pretrained(transformers.AutoModelForMaskedLM, tmp_path, output_loading_info=True)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()


def test_layout_recorded_by_save_pretrained_after_manual_conversion(tmp_path):
    model = build("roberta", patched=False)
    dense = model.roberta.encoder.layer[1].intermediate.dense
    model.roberta.encoder.layer[1].intermediate.dense = BlockSparseLinear.from_dense(dense, 0.5, (16, 16))
    bs.save_pretrained(model, tmp_path)
    loaded = bs.from_pretrained(transformers.RobertaForMaskedLM, tmp_path)
    assert list(sparse_types(loaded)) == ["roberta.encoder.layer.1.intermediate.dense"]
    assert torch.equal(logits(loaded), logits(model))


# ------------------------------------------------------------------------------------------------ errors
def _corrupt(path, change) -> None:
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    change(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def _edit_config(path, change) -> None:
    file = os.path.join(path, "config.json")
    config = json.loads(open(file).read())
    change(config)
    open(file, "w").write(json.dumps(config))


LAYER = "roberta.encoder.layer.0.intermediate.dense"


def _swap_first_columns(tensors):
    cols = tensors[LAYER + ".weight.col_indices"]
    cols[0], cols[1] = cols[1].item(), cols[0].item()


@pytest.mark.parametrize("change, message", [
    (_swap_first_columns, r"layer '" + LAYER + r"'.*col_indices is inconsistent"),
    (lambda t: t.pop(LAYER + ".weight.row_offsets"), r"missing \['weight.row_offsets'\]"),
    (lambda t: t.update({LAYER + ".weight.data": t[LAYER + ".weight.data"][:-1]}), r"layer '" + LAYER + "'"),
    (lambda t: t.update({LAYER + ".weight.perm_t": t[LAYER + ".weight.perm_t"].long()}), "must be torch.int32"),
    (lambda t: t["roberta.encoder.layer.1.attention.output.dense.mask"][0, :4].fill_(True), "not 2:4"),
])
def test_corrupted_checkpoint_raises_naming_the_layer(tmp_path, change, message):
    build("roberta").save_pretrained(tmp_path)
    _corrupt(tmp_path, change)
    with pytest.raises(ValueError, match=message):
        bs.from_pretrained(transformers.AutoModelForMaskedLM, tmp_path)


def test_layout_that_disagrees_with_the_tensors_raises(tmp_path):
    build("roberta").save_pretrained(tmp_path)
    _edit_config(tmp_path, lambda c: c["pytorch_block_sparse_ng"]["layers"][LAYER].update(nnz_blocks=15))
    with pytest.raises(ValueError, match=r"(?s)layer '" + LAYER + "'.*size mismatch"):
        bs.from_pretrained(transformers.AutoModelForMaskedLM, tmp_path)


def test_layer_missing_from_the_layout_raises(tmp_path):
    build("roberta").save_pretrained(tmp_path)
    _edit_config(tmp_path, lambda c: c["pytorch_block_sparse_ng"]["layers"].pop(LAYER))
    with pytest.raises(ValueError, match=r"block-sparse tensors for \['" + LAYER + r"'\].*stale layout"):
        bs.from_pretrained(transformers.AutoModelForMaskedLM, tmp_path)


def test_checkpoint_saved_with_pruning_masks_on_dense_layers_raises(tmp_path):
    model = build("roberta")
    layer = "roberta.encoder.layer.1.attention.self.query"
    bs.prune_model(model, {layer.replace(".", r"\."): {"sparsity": "2:4"}}, convert=False, progress=False)
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"masks held on dense layers \['" + layer + r"'\].*convert_masked_model"):
        bs.from_pretrained(transformers.AutoModelForMaskedLM, tmp_path)
    bs.convert_masked_model(model)  # converted, the same model saves and loads
    model.save_pretrained(tmp_path / "converted")
    assert torch.equal(logits(bs.from_pretrained(transformers.AutoModelForMaskedLM, tmp_path / "converted")),
                       logits(model))


def test_configuration_of_other_sizes_raises(tmp_path):
    build("roberta").save_pretrained(tmp_path)
    _edit_config(tmp_path, lambda c: c.update(intermediate_size=256))
    with pytest.raises(ValueError, match=r"\(128, 64\) in the checkpoint but \(256, 64\) in the model"):
        bs.from_pretrained(transformers.AutoModelForMaskedLM, tmp_path)


def test_mismatched_dense_tensor_outside_sparse_layers_raises(tmp_path):
    model = build("roberta")
    model.save_pretrained(tmp_path)
    _corrupt(tmp_path, lambda t: t.update({"roberta.embeddings.LayerNorm.weight": torch.ones(32)}))
    with pytest.raises(ValueError, match=r"other shapes than the model's for \['roberta.embeddings.LayerNorm"):
        bs.from_pretrained(transformers.AutoModelForMaskedLM, tmp_path)


def test_layer_left_on_the_meta_device_raises(tmp_path):
    build("roberta").save_pretrained(tmp_path)

    class Offloading:  # what an offloading device_map leaves: the dense layer on the meta device
        @staticmethod
        def from_pretrained(path, **kwargs):
            model, info = transformers.AutoModelForMaskedLM.from_pretrained(path, **kwargs)
            model.get_submodule(LAYER).to("meta")
            return model, info

    with pytest.raises(ValueError, match=r"layer '" + LAYER + "'.*meta device"):
        bs.from_pretrained(Offloading, tmp_path)


def test_dense_checkpoint_raises(tmp_path):
    build("roberta", patched=False).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no 'pytorch_block_sparse_ng' entry in config.json"):
        bs.from_pretrained(transformers.AutoModelForMaskedLM, tmp_path)


def test_model_class_without_the_layers_raises(tmp_path):
    build("roberta").save_pretrained(tmp_path)
    _edit_config(tmp_path, lambda c: c["pytorch_block_sparse_ng"]["layers"].update(
        {"roberta.encoder.layer.9.output.dense": c["pytorch_block_sparse_ng"]["layers"][LAYER]}))
    with pytest.raises(ValueError, match=r"sparse layer 'roberta.encoder.layer.9.output.dense' but "
                                         r"RobertaForMaskedLM has no module"):
        bs.from_pretrained(transformers.AutoModelForMaskedLM, tmp_path)


# ------------------------------------------------------------------------------------------------ Trainer
class ByteChunks(torch.utils.data.Dataset):
    """Consecutive ``length``-byte chunks of data/tiny_corpus.txt, as causal-LM examples."""

    def __init__(self, length: int = 32, count: int = 64, mlm: bool = False):
        data = open(CORPUS, "rb").read()
        self.chunks = [torch.tensor(list(data[i * length:(i + 1) * length])) for i in range(count)]
        self.mlm = mlm

    def __len__(self):
        return len(self.chunks)

    def __getitem__(self, i):
        if not self.mlm:
            return {"input_ids": self.chunks[i], "labels": self.chunks[i]}
        # Masked LM: a fixed 25% of the bytes replaced by id 3, predicted; the rest ignored (-100).
        hidden = torch.rand(len(self.chunks[i]), generator=torch.Generator().manual_seed(i)) < 0.25
        return {"input_ids": self.chunks[i].masked_fill(hidden, 3),
                "labels": self.chunks[i].masked_fill(~hidden, -100)}


def train(model, tmp_path, steps: int, train_dataset=None, checkpointing: bool = False, **args):
    if checkpointing:  # renamed activation_checkpointing in transformers 5
        fields = transformers.TrainingArguments.__dataclass_fields__
        args["activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"] = True
    defaults = dict(output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=4, max_steps=steps,
                    learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, report_to=[],
                    save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0, data_seed=0)
    defaults.update(args)
    trainer = transformers.Trainer(model=model, args=transformers.TrainingArguments(**defaults),
                                   train_dataset=train_dataset or ByteChunks())
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def watch(layer):
    """Record (autocast on, output dtype) of every forward of ``layer``."""
    calls = []
    layer.register_forward_hook(lambda module, args, out: calls.append((torch.is_autocast_enabled(out.device.type),
                                                                        out.dtype)))
    return calls


@pytest.mark.slow
def test_trainer_bf16_cpu_with_checkpointing_and_accumulation_lowers_the_loss(tmp_path):
    model = build("llama")
    layer = model.model.layers[0].mlp.up_proj
    pattern = layer.weight.block_mask().clone()
    calls = watch(layer)
    losses = train(model, tmp_path, steps=12, bf16=True, use_cpu=True, checkpointing=True,
                   gradient_accumulation_steps=2, per_device_train_batch_size=2)
    assert len(losses) == 12
    # bf16 autocast reached the sparse layer; gradient checkpointing ran each forward twice (recompute in
    # backward): 12 steps x 2 micro-batches x 2.
    assert calls and all(call == (True, torch.bfloat16) for call in calls)
    assert len(calls) == 12 * 2 * 2
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, losses
    assert layer.weight.data.dtype == torch.float32  # master weights stay fp32
    assert torch.equal(layer.weight.block_mask(), pattern)


@pytest.mark.slow
def test_gradient_accumulation_matches_the_large_batch(tmp_path):
    """Two micro-batches of 2 accumulated give the same update as one batch of 4 (fp32, no dropout). SGD, whose
    update is linear in the gradient: Adam's first step, lr * sign(g), would turn summation-order noise in
    near-zero gradients into full-size differences."""
    large, accumulated = build("llama"), build("llama")
    train(large, tmp_path / "large", steps=1, per_device_train_batch_size=4, use_cpu=True, optim="sgd",
          learning_rate=0.5)
    train(accumulated, tmp_path / "acc", steps=1, per_device_train_batch_size=2, gradient_accumulation_steps=2,
          use_cpu=True, optim="sgd", learning_rate=0.5)
    initial = build("llama")
    for (name, p), q in zip(large.named_parameters(), accumulated.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
    blocks = "model.layers.0.mlp.up_proj.weight.data"
    assert not torch.equal(large.get_parameter(blocks), initial.get_parameter(blocks))  # the sparse blocks trained


@pytest.mark.slow
def test_trainer_masked_lm_with_2_4_layers_keeps_them_2_4(tmp_path):
    model = build("roberta")
    layer = model.roberta.encoder.layer[0].attention.output.dense
    losses = train(model, tmp_path, steps=6, use_cpu=True, checkpointing=True,
                   train_dataset=ByteChunks(mlm=True))
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.3, losses
    assert (layer.masked_weight()[~layer.mask] == 0).all()
    assert (layer.mask.view(layer.out_features, -1, 4).sum(-1) == 2).all()


@pytest.mark.slow
def test_trainer_checkpoints_resume_into_a_patched_model_with_its_patterns(tmp_path):
    """Trainer saves checkpoints of a patched model and resumes from them: a model patched with other patterns
    (another seed) takes the checkpoint's patterns and ends where an uninterrupted run ends."""
    first = build("llama")
    train(first, tmp_path, steps=4, save_strategy="steps", save_steps=2, use_cpu=True)
    checkpoint = bs.from_pretrained(transformers.AutoModelForCausalLM, tmp_path / "trainer" / "checkpoint-2")
    assert sparse_types(checkpoint) == sparse_types(first)  # Trainer's checkpoints are sparse checkpoints
    resumed = build("llama", seed=5)
    name = "model.layers.1.mlp.gate_proj"
    assert not torch.equal(resumed.get_submodule(name).weight.block_mask(), first.get_submodule(name).weight.block_mask())
    args = dict(output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=4, max_steps=4, learning_rate=3e-3,
                lr_scheduler_type="constant", report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=True,
                dataloader_num_workers=0, seed=0, data_seed=0)
    trainer = transformers.Trainer(model=resumed, args=transformers.TrainingArguments(**args),
                                   train_dataset=ByteChunks())
    trainer.train(resume_from_checkpoint=str(tmp_path / "trainer" / "checkpoint-2"))
    assert torch.equal(resumed.get_submodule(name).weight.block_mask(), first.get_submodule(name).weight.block_mask())
    for (key, p), q in zip(first.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 mixed precision needs a CUDA GPU (none visible)")
def test_trainer_fp16_cuda_lowers_the_loss(tmp_path):
    model = build("llama").cuda()
    calls = watch(model.model.layers[0].mlp.up_proj)
    losses = train(model, tmp_path, steps=12, fp16=True, checkpointing=True, gradient_accumulation_steps=2,
                   per_device_train_batch_size=2)
    assert calls and all(call == (True, torch.float16) for call in calls)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, losses
    # Saved from the GPU, loaded on the CPU: the same function. (Trainer left fp16 autocast wrapped around
    # model.forward; take it off to compare in fp32.)
    from accelerate.utils import extract_model_from_parallel
    model = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    model.save_pretrained(tmp_path / "saved")
    loaded = bs.from_pretrained(transformers.AutoModelForCausalLM, tmp_path / "saved")
    torch.testing.assert_close(logits(loaded), logits(model.float(), ids().cuda()).cpu(), rtol=1e-4, atol=1e-4)
