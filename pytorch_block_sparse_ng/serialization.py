"""Saving and reloading models whose layers were made sparse.

A sparse model's ``state_dict`` holds everything numeric (kept blocks, int32 indices, masks), but a fresh model
built from the same code is dense, so it cannot take that state dict until its layers are made sparse again
*with the same structure*. The **layout** is that structure, a JSON-able dict::

    {"format": "pytorch_block_sparse_ng", "format_version": 1, "package_version": "0.2.0.dev0",
     "layers": {"roberta.encoder.layer.0.intermediate.dense":
                    {"kind": "block", "in_features": 64, "out_features": 128, "bias": true,
                     "block_shape": [16, 16], "nnz_blocks": 16, "density": 0.5, "replaces": "Linear"}, ...}}

``kind`` is "block" (``BlockSparseLinear``), "semi_structured" (``SemiStructuredLinear``, with ``sparsity``
"2:4"), "pseudo_block" (``PseudoBlockSparseLinear``) or "masked" (``MaskedLinear``).

Hugging Face models: ``BlockSparseModelPatcher.patch_model`` records the layout in ``model.config`` (key
``pytorch_block_sparse_ng``), so ``model.save_pretrained(path)`` writes it to ``config.json`` next to
``model.safetensors``; ``from_pretrained(model_class, path)`` rebuilds the sparse layers and loads them.
Plain ``transformers`` loading (``AutoModel.from_pretrained``) does *not* know the sparse layers: it builds dense
ones, reports their weights as missing and initialises them randomly -- use ``from_pretrained`` here.

Other models: ``save_sparse_state_dict(model, f)`` saves the layout with the state dict and
``load_sparse_state_dict(fresh_dense_model, f)`` re-creates the sparse layers and loads it strictly.

Every loader checks the checkpoint against the layout and raises a ``ValueError`` naming the layer and the
tensor when they disagree; index tensors are checked for consistency (``BlockSparseMatrix``) before use.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
from torch import nn

from .layout import BlockSparseMatrix, check_block_shape
from .masks import parse_nm
from .modules import (BlockSparseLinear, MaskedLinear, PseudoBlockSparseLinear, SemiStructuredLinear,
                      _is_hf_conv1d)

__all__ = ["LAYOUT_KEY", "sparse_layout", "record_layout", "restore_sparse_layers", "save_sparse_state_dict",
           "load_sparse_state_dict", "save_pretrained", "from_pretrained"]

LAYOUT_KEY = "pytorch_block_sparse_ng"  # attribute of a transformers config, key in config.json and checkpoints
FORMAT_VERSION = 1
_KINDS = ("block", "semi_structured", "pseudo_block", "masked")


# ------------------------------------------------------------------------------------------------ the layout
def _layer_layout(module: nn.Module) -> Optional[Dict[str, Any]]:
    """The layout entry of one sparse layer, or None if ``module`` is not one of ours."""
    common = dict(in_features=int(module.in_features), out_features=int(module.out_features),
                  bias=module.bias is not None) if hasattr(module, "in_features") else {}
    if isinstance(module, BlockSparseLinear):
        return dict(kind="block", **common, block_shape=list(module.block_shape),
                    nnz_blocks=int(module.weight.nnz_blocks), density=float(module.density))
    if isinstance(module, SemiStructuredLinear):
        n, m = module.sparsity
        return dict(kind="semi_structured", **common, sparsity=f"{n}:{m}",
                    use_sparse_kernels=bool(module.use_sparse_kernels))
    if isinstance(module, PseudoBlockSparseLinear):
        return dict(kind="pseudo_block", **common, block_shape=list(module.block_shape))
    if isinstance(module, MaskedLinear):
        return dict(kind="masked", **common)
    return None


def sparse_layout(model: nn.Module) -> Dict[str, Any]:
    """The layout of every sparse layer of ``model`` (see the module docstring); JSON-serialisable.

    The layout says which layers are sparse and their kind, sizes and block shape or N:M; the block positions
    themselves are in the state dict (int32 index buffers, or the bool ``mask``)."""
    layers = {}
    for name, module in model.named_modules():
        entry = _layer_layout(module)
        if entry is not None:
            if not name:
                raise ValueError(f"sparse_layout: the model itself is a {type(module).__name__}; the layout records "
                                 f"sparse layers *inside* a model")
            layers[name] = entry
    from . import __version__  # the package __init__ imports this module

    return dict(format=LAYOUT_KEY, format_version=FORMAT_VERSION, package_version=__version__, layers=layers)


def _has_hf_config(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    return config is not None and hasattr(config, "to_dict") and hasattr(config, "save_pretrained")


def record_layout(model: nn.Module) -> Dict[str, Any]:
    """Store ``sparse_layout(model)`` in ``model.config`` (a transformers config) so that ``save_pretrained``
    writes it to config.json; returns it. ``BlockSparseModelPatcher.patch_model`` calls this; call it yourself
    after changing layers another way (or use ``save_pretrained`` of this package, which does)."""
    if not _has_hf_config(model):
        raise TypeError(f"record_layout: {type(model).__name__} has no transformers config (model.config); for "
                        f"other models use save_sparse_state_dict / load_sparse_state_dict")
    layout = sparse_layout(model)
    for name, entry in layout["layers"].items():  # remember what the layer replaced, for checks at load time
        previous = (getattr(model.config, LAYOUT_KEY, None) or {}).get("layers", {}).get(name, {})
        if "replaces" in previous:
            entry["replaces"] = previous["replaces"]
    setattr(model.config, LAYOUT_KEY, layout)
    return layout


def _note_replaced(model: nn.Module, replaced: Dict[str, str]) -> None:
    """Called by the patcher: record the layout, with the class each new layer replaced ("Linear", "Conv1D")."""
    if not _has_hf_config(model):
        return
    layout = record_layout(model)
    for name, old_type in replaced.items():
        if name in layout["layers"]:
            layout["layers"][name]["replaces"] = old_type


def _check_layout(layout: Any, where: str) -> Dict[str, Dict[str, Any]]:
    """Validate a layout dict (from a file) and return its layers; ValueError on anything unexpected."""
    if not isinstance(layout, dict) or layout.get("format") != LAYOUT_KEY or "layers" not in layout:
        raise ValueError(f"{where}: not a {LAYOUT_KEY} layout (expected a dict with format={LAYOUT_KEY!r} and "
                         f"'layers'), got {str(layout)[:200]}")
    if layout.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{where}: layout format_version={layout.get('format_version')!r} is not supported by "
                         f"this version (reads {FORMAT_VERSION}); upgrade pytorch_block_sparse_ng")
    layers = layout["layers"]
    if not isinstance(layers, dict):
        raise ValueError(f"{where}: layout['layers'] must be a dict name -> entry, got {type(layers).__name__}")
    for name, entry in layers.items():
        kind = entry.get("kind") if isinstance(entry, dict) else None
        if kind not in _KINDS:
            raise ValueError(f"{where}: layer '{name}' has kind={kind!r}, must be one of {_KINDS}")
        for key in ("in_features", "out_features"):
            value = entry.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{where}: layer '{name}' has {key}={value!r}, must be a positive integer")
        if not isinstance(entry.get("bias"), bool):
            raise ValueError(f"{where}: layer '{name}' has bias={entry.get('bias')!r}, must be true or false")
        if kind in ("block", "pseudo_block"):
            check_block_shape(entry.get("block_shape"), f"{where}: layer '{name}'")
        if kind == "block":
            nnz = entry.get("nnz_blocks")
            br, bc = entry["block_shape"]
            total = (entry["out_features"] // br) * (entry["in_features"] // bc)
            if isinstance(nnz, bool) or not isinstance(nnz, int) or not 0 <= nnz <= total:
                raise ValueError(f"{where}: layer '{name}' has nnz_blocks={nnz!r}, must be an integer in [0, {total}]")
        if kind == "semi_structured":
            parse_nm(entry.get("sparsity"), f"{where}: layer '{name}'")
    return layers


# ------------------------------------------------------------------------------------------------ rebuilding
def _placeholder(entry: Dict[str, Any], device, dtype, owner: str) -> nn.Module:
    """A sparse layer with the structure of ``entry``; its values and block positions are placeholders, to be
    overwritten by ``load_state_dict`` (which validates the indices it receives)."""
    kind, n_in, n_out, bias = entry["kind"], entry["in_features"], entry["out_features"], entry["bias"]
    factory = dict(device=device, dtype=dtype)
    if kind == "block":
        block_shape = tuple(entry["block_shape"])
        layer = BlockSparseLinear(n_in, n_out, bias, density=0.0, block_shape=block_shape, **factory)
        nnz = entry["nnz_blocks"]
        grid_cols = n_in // block_shape[1]
        blocks = [(i // grid_cols, i % grid_cols) for i in range(nnz)]
        layer.weight = BlockSparseMatrix.zeros((n_out, n_in), blocks=blocks, block_shape=block_shape, **factory)
        return layer
    weight = torch.zeros(n_out, n_in, **factory)
    bias_t = torch.zeros(n_out, **factory) if bias else None
    mask = torch.ones(n_out, n_in, dtype=torch.bool, device=device)
    if kind == "semi_structured":
        n, m = parse_nm(entry["sparsity"], owner)
        if n_in % m:
            raise ValueError(f"{owner}: layer has in_features={n_in}, not a multiple of M={m} (sparsity {n}:{m})")
        layer = SemiStructuredLinear.__new__(SemiStructuredLinear)
        MaskedLinear.__init__(layer, weight, bias_t, mask)
        layer._init_semi_structured((n, m), bool(entry.get("use_sparse_kernels", True)))
        return layer
    if kind == "pseudo_block":
        layer = PseudoBlockSparseLinear.__new__(PseudoBlockSparseLinear)
        MaskedLinear.__init__(layer, weight, bias_t, mask)
        layer.block_shape = check_block_shape(entry["block_shape"], owner)
        return layer
    return MaskedLinear(weight, bias_t, mask)


def _check_loaded(layer: nn.Module, entry: Dict[str, Any], owner: str) -> None:
    """Invariants a mask must satisfy after loading (indices are checked by BlockSparseMatrix itself)."""
    if entry["kind"] == "semi_structured":
        n, m = layer.sparsity
        if not bool((layer.mask.view(layer.out_features, -1, m).sum(-1) <= n).all()):
            raise ValueError(f"{owner}: mask keeps more than N={n} of some group of M={m} inputs; it is not "
                             f"{n}:{m} sparse")
    if entry["kind"] == "pseudo_block":
        br, bc = layer.block_shape
        tiles = layer.mask.view(layer.out_features // br, br, layer.in_features // bc, bc)
        if not bool((tiles.all(dim=(1, 3)) == tiles.any(dim=(1, 3))).all()):
            raise ValueError(f"{owner}: mask is not made of whole {br}x{bc} blocks")


def _dense_site(model: nn.Module, name: str, entry: Dict[str, Any], owner: str) -> nn.Module:
    """The module at ``name`` of a freshly built model, checked against the layout entry."""
    try:
        module = model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"{owner}: the checkpoint has a sparse layer '{name}' but {type(model).__name__} has no "
                         f"module of that name (another model class or configuration?)") from None
    if _layer_layout(module) is not None:
        raise ValueError(f"{owner}: '{name}' is already a sparse {type(module).__name__}; restore sparse layers into "
                         f"a freshly built dense model")
    if isinstance(module, nn.Linear):
        sizes = (module.out_features, module.in_features)
    elif _is_hf_conv1d(module):
        sizes = (module.weight.shape[1], module.weight.shape[0])
    else:
        raise ValueError(f"{owner}: the checkpoint has a sparse layer '{name}' but the model has a "
                         f"{type(module).__name__} there, not an nn.Linear or transformers Conv1D")
    recorded = (entry["out_features"], entry["in_features"])
    if sizes != recorded:
        raise ValueError(f"{owner}: layer '{name}' is (out_features, in_features)={recorded} in the checkpoint but "
                         f"{sizes} in the model (another configuration?)")
    return module


def restore_sparse_layers(model: nn.Module, layout: Dict[str, Any]) -> nn.Module:
    """Replace the dense layers of a freshly built ``model`` named in ``layout`` by sparse layers of the recorded
    structure, on each dense layer's device and dtype; returns ``model``.

    The new layers hold placeholder values and block positions: load the checkpoint's state dict next
    (``load_sparse_state_dict`` does both). Raises ValueError if a named layer is missing or has other sizes."""
    owner = "restore_sparse_layers"
    layers = _check_layout(layout, owner)
    new = {}
    for name, entry in layers.items():
        dense = _dense_site(model, name, entry, owner)
        new[name] = _placeholder(entry, dense.weight.device, dense.weight.dtype, f"{owner}: layer '{name}'")
    for name, layer in new.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer)
    if _has_hf_config(model):
        setattr(model.config, LAYOUT_KEY, json.loads(json.dumps(layout)))
    return model


def _load_layer(layer: nn.Module, tensors: Dict[str, torch.Tensor], entry: Dict[str, Any], owner: str) -> None:
    expected = set(layer.state_dict())
    missing, unexpected = expected - set(tensors), set(tensors) - expected
    if missing or unexpected:
        raise ValueError(f"{owner}: the checkpoint's tensors do not match a {entry['kind']} layer: "
                         f"missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    try:
        layer.load_state_dict(tensors, strict=True)
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"{owner}: {error}") from None
    _check_loaded(layer, entry, owner)


# ------------------------------------------------------------------------------------------------ plain torch
def save_sparse_state_dict(model: nn.Module, f) -> None:
    """``torch.save`` the state dict of ``model`` together with its layout (to a path or file object)."""
    torch.save({"layout": sparse_layout(model), "state_dict": model.state_dict()}, f)


def load_sparse_state_dict(model: nn.Module, checkpoint, layout: Optional[Dict[str, Any]] = None) -> nn.Module:
    """Make a freshly built dense ``model`` sparse as recorded and load the checkpoint strictly; returns ``model``.

    ``checkpoint``: a path or file written by ``save_sparse_state_dict`` (loaded with ``weights_only=True``),
    the dict it holds, or a plain state dict together with ``layout`` (from ``sparse_layout``).
    Raises ValueError when the checkpoint and the layout or the model disagree."""
    owner = "load_sparse_state_dict"
    if isinstance(checkpoint, (str, os.PathLike)) or hasattr(checkpoint, "read"):
        checkpoint = torch.load(checkpoint, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict):
        raise ValueError(f"{owner}: checkpoint must be a dict, got {type(checkpoint).__name__}")
    if layout is None:
        if set(checkpoint) != {"layout", "state_dict"}:
            raise ValueError(f"{owner}: checkpoint has no layout (keys {sorted(checkpoint)[:5]}...); save it with "
                             f"save_sparse_state_dict or pass layout=sparse_layout(model)")
        layout, state_dict = checkpoint["layout"], checkpoint["state_dict"]
    else:
        state_dict = checkpoint
    layers = _check_layout(layout, owner)
    restore_sparse_layers(model, layout)
    for name, entry in layers.items():  # per layer first: errors that name the layer
        prefix = name + "."
        tensors = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        _load_layer(model.get_submodule(name), tensors, entry, f"{owner}: layer '{name}'")
    try:
        model.load_state_dict(state_dict, strict=True)
    except RuntimeError as error:
        raise ValueError(f"{owner}: {error}") from None
    return model


# ------------------------------------------------------------------------------------------------ transformers
def save_pretrained(model: nn.Module, save_directory, **kwargs) -> None:
    """``record_layout(model)`` then ``model.save_pretrained(save_directory, **kwargs)``. Plain
    ``model.save_pretrained`` is enough after ``BlockSparseModelPatcher.patch_model``; use this one when layers
    were changed another way since."""
    record_layout(model)
    model.save_pretrained(save_directory, **kwargs)


_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")


def _checkpoint_files(path, kwargs) -> list:
    """The safetensors file(s) of a checkpoint directory (or hub id, through transformers' cache)."""
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, cached_file

    hub = {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs}
    lookup = dict(hub, _raise_exceptions_for_missing_entries=False)
    single = cached_file(path, SAFE_WEIGHTS_NAME, **lookup)
    if single is not None:
        return [single]
    index = cached_file(path, SAFE_WEIGHTS_INDEX_NAME, **lookup)
    if index is None:
        raise ValueError(f"from_pretrained: no {SAFE_WEIGHTS_NAME} or {SAFE_WEIGHTS_INDEX_NAME} in {path}; sparse "
                         f"checkpoints are read from safetensors files (the default of save_pretrained)")
    with open(index, encoding="utf-8") as handle:
        shards = sorted(set(json.load(handle)["weight_map"].values()))
    return [cached_file(path, shard, **hub) for shard in shards]


def _read_tensors(files, prefixes) -> Dict[str, torch.Tensor]:
    from safetensors import safe_open

    found = {}
    for file in files:
        with safe_open(file, framework="pt") as handle:
            for key in handle.keys():
                if key.startswith(prefixes):
                    found[key] = handle.get_tensor(key)
    return found


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' load report: it would call the sparse tensors unexpected and the dense weights they
    replace missing (both are handled here)."""
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)


def _under(key: str, names) -> bool:
    return any(key == name or key.startswith(name + ".") for name in names)


def _has_module(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
        return True
    except AttributeError:
        return False


def _name_in(model: nn.Module, name: str) -> str:
    """``name`` as saved -> the same layer's name in ``model``: transformers loads a base model's checkpoint into
    a model with a head (and back) by adding (or dropping) ``base_model_prefix``."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    candidates = [name]
    if prefix:
        candidates += [f"{prefix}.{name}", name[len(prefix) + 1:] if name.startswith(prefix + ".") else None]
    for candidate in candidates:
        if candidate and _has_module(model, candidate):
            return candidate
    return name  # _dense_site reports it


def from_pretrained(model_class, pretrained_model_name_or_path, **kwargs):
    """Load a checkpoint written by ``save_pretrained`` of a patched transformers model, sparse layers included.

    ``model_class``: the model class or an Auto class (``AutoModelForMaskedLM``); ``kwargs`` go to its
    ``from_pretrained`` (``dtype``, ``device_map``, ``revision``, ``output_loading_info``, ...). transformers
    loads every other tensor; the sparse layers named in config.json's ``pytorch_block_sparse_ng`` entry are
    rebuilt with their recorded structure on the device and in the dtype transformers chose for the dense layer,
    and loaded from the safetensors file(s) strictly: indices are validated, and a tensor missing, extra or of
    the wrong shape raises a ValueError naming the layer. Outputs equal those of the saved model bit for bit
    (same dtype and device).

    Other keys follow transformers' rules (e.g. a new classification head is reported missing and initialised),
    re-emitted as a ``UserWarning``; sizes that do not match raise unless ``ignore_mismatched_sizes=True``.
    Sparse layers the model class does not have (a head, loaded into a base model) are left out with a
    ``UserWarning``; block-sparse tensors of a layer the layout does not name (a stale layout) raise.
    Returns the model (and transformers' loading info, restricted to the keys outside the sparse layers, with
    ``output_loading_info=True``).
    """
    owner = "pytorch_block_sparse_ng.from_pretrained"
    want_info = kwargs.pop("output_loading_info", False)
    user_ignores_mismatch = kwargs.pop("ignore_mismatched_sizes", False)
    with _quiet_transformers():
        # ignore_mismatched_sizes: a 2:4 layer stores an (out, in) weight where a GPT-2 Conv1D expects (in, out);
        # mismatches outside the sparse layers are raised below unless the caller asked to ignore them.
        model, info = model_class.from_pretrained(pretrained_model_name_or_path, output_loading_info=True,
                                                  ignore_mismatched_sizes=True, **kwargs)
    layout = getattr(model.config, LAYOUT_KEY, None)
    if layout is None:
        raise ValueError(f"{owner}: {pretrained_model_name_or_path} has no '{LAYOUT_KEY}' entry in config.json, so "
                         f"it is not a sparse checkpoint of this package (load a dense one with "
                         f"{getattr(model_class, '__name__', model_class)}.from_pretrained; a model patched without "
                         f"the patcher is saved with pytorch_block_sparse_ng.save_pretrained)")
    layers = _check_layout(layout, f"{owner}: config.json")
    names = list(layers) + [_name_in(model, name) for name in layers]  # as saved, and as in this model

    mismatched = [key for key, *_ in (info.get("mismatched_keys") or [])] if info else []
    foreign = [key for key in mismatched if not _under(key, names)]
    if foreign and not user_ignores_mismatch:
        raise ValueError(f"{owner}: the checkpoint's tensors have other shapes than the model's for {foreign[:5]} "
                         f"(pass ignore_mismatched_sizes=True to initialise them afresh)")
    other_missing = sorted(k for k in info.get("missing_keys", ()) if not _under(k, names))
    other_unexpected = sorted(k for k in info.get("unexpected_keys", ()) if not _under(k, names))
    masked = sorted({k.split(".parametrizations.")[0] for k in other_unexpected if ".parametrizations.weight." in k})
    if masked:  # the dense weight transformers looked for is missing: it would be initialised at random
        raise ValueError(f"{owner}: the checkpoint was saved with masks held on dense layers {masked[:5]} (pruning in "
                         f"progress); convert them first (pytorch_block_sparse_ng.convert_masked_model) or bake them "
                         f"in (remove_masks), then save")
    unrecorded = sorted({k.rsplit(".", 2)[0] for k in other_unexpected if k.endswith(".weight.row_offsets")})
    if unrecorded:  # a block-sparse layer the layout does not name would stay dense with random weights
        raise ValueError(f"{owner}: the checkpoint holds block-sparse tensors for {unrecorded[:5]}, which the layout "
                         f"in config.json does not record (a stale layout: re-save the model with "
                         f"pytorch_block_sparse_ng.save_pretrained, which records it again)")
    if other_missing or other_unexpected:
        warnings.warn(f"{owner}: outside the sparse layers, transformers found missing keys {other_missing[:10]} "
                      f"(initialised afresh) and unexpected keys {other_unexpected[:10]} (ignored)", UserWarning,
                      stacklevel=2)

    files = _checkpoint_files(pretrained_model_name_or_path, kwargs)
    tensors = _read_tensors(files, tuple(name + "." for name in names))
    new, unused = {}, []
    for name, entry in layers.items():
        where = f"{owner}: layer '{name}'"
        own = {}
        for prefix in (name + ".", _name_in(model, name) + "."):  # as recorded; as in the model (a patched
            own = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}  # base model)
            if own:
                break
        if own and not _has_module(model, _name_in(model, name)):
            unused.append(name)  # saved but not part of this model (a head loaded into a base model): as transformers
            continue
        dense = _dense_site(model, _name_in(model, name), entry, where)
        if dense.weight.device.type == "meta":
            raise ValueError(f"{where}: transformers left this layer on the meta device (offloaded by device_map?); "
                             f"sparse layers must be loaded onto a real device")
        layer = _placeholder(entry, dense.weight.device, dense.weight.dtype, where)
        _load_layer(layer, own, entry, where)
        layer.train(dense.training)
        new[name] = layer
    for name, layer in new.items():
        parent, _, child = _name_in(model, name).rpartition(".")
        setattr(model.get_submodule(parent), child, layer)
    if unused:
        warnings.warn(f"{owner}: sparse layers of the checkpoint that {type(model).__name__} does not have were not "
                      f"used: {unused[:10]}", UserWarning, stacklevel=2)
    record_layout(model)  # names as in this model (a base model saved, a model with a head loaded, or back)
    if want_info:
        info = dict(info)
        info["missing_keys"], info["unexpected_keys"] = set(other_missing), set(other_unexpected)
        info["mismatched_keys"] = [m for m in (info.get("mismatched_keys") or []) if not _under(m[0], names)]
        return model, info
    return model
