"""The generated documentation: doc/api.md covers exactly the public names, doc/gen_performance.py turns
benchmark records into tables (and says plainly when there are none), and the docs' relative links resolve."""

import importlib.util
import json
import os
import re

import pytest

import pytorch_block_sparse_ng

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "doc")


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(DOC, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_md_has_one_section_per_public_name():
    text = open(os.path.join(DOC, "api.md"), encoding="utf-8").read()
    sections = re.findall(r"^### `([^`]+)`$", text, flags=re.M)
    assert sorted(sections) == sorted(pytorch_block_sparse_ng.__all__), "run: python doc/gen_api.py"
    generated = load_script("gen_api").generate()
    for name in ("from_pretrained", "BlockSparseLinear", "BlockSparseModelPatcher"):
        section = re.search(rf"^### `{name}`$.*?(?=^### |\Z)", generated, flags=re.M | re.S).group(0)
        assert section in text, f"the section of {name} in doc/api.md is out of date: run python doc/gen_api.py"


def test_performance_page_without_results_says_so(tmp_path):
    text = load_script("gen_performance").generate(str(tmp_path), str(tmp_path / "performance.md"))
    assert "No benchmark results have been committed yet" in text
    assert "×" not in text


def test_performance_page_tables_from_records(tmp_path):
    # A result file in bench_linear.py's format, made up for this test only (it stays in tmp_path).
    records = [dict(method="dense", phase="forward", dtype="bf16", m=64, k=128, n=256, ms=2.0),
               dict(method="ours", phase="forward", dtype="bf16", m=64, k=128, n=256, block=32, density=0.25,
                    ms=1.0, speedup=2.0),
               dict(method="ours", phase="forward", dtype="bf16", m=64, k=128, n=256, block=32, density=0.5,
                    ms=2.5, speedup=0.8),
               dict(method="torch_bsr", phase="forward", dtype="bf16", m=64, k=128, n=256, block=32, density=0.5,
                    error="RuntimeError: no")]
    meta = dict(gpu="Test GPU 80GB", torch="2.x", cuda="13.0", reps=5)
    (tmp_path / "bench_linear_Test.json").write_text(json.dumps(dict(meta=meta, records=records)))
    text = load_script("gen_performance").generate(str(tmp_path), str(tmp_path / "performance.md"))
    assert "## Test GPU 80GB" in text and "torch 2.x, CUDA 13.0" in text
    assert "### bf16, M=64 tokens, 128 → 256 (dense: forward 2 ms)" in text
    assert "| BlockSparseLinear | forward | 32 | 2.00× (1 ms) | 0.80× (2.5 ms) |" in text
    assert "torch_bsr bf16 M=64 128→256 block 32 density 0.5: RuntimeError: no" in text
    assert "No benchmark results" not in text


def test_performance_page_shows_the_latest_session_of_a_series(tmp_path):
    # Made-up result files (they stay in tmp_path): two sessions of one series and a file of no series.
    files = {"bench_linear_b32_session8_bf16_X": "Session 8 GPU", "bench_linear_b32_session12_bf16_X": "Session 12 GPU",
             "bench_linear_X": "Full run GPU"}
    for name, gpu in files.items():
        meta = dict(gpu=gpu, torch="2.x", cuda="13.0", reps=5)
        (tmp_path / f"{name}.json").write_text(json.dumps(dict(meta=meta, records=[])))
    text = load_script("gen_performance").generate(str(tmp_path), str(tmp_path / "performance.md"))
    assert "## Session 12 GPU" in text and "## Full run GPU" in text
    assert "Session 8 GPU" not in text  # session 12 supersedes it (numerically, not as text: "12" < "8")


@pytest.mark.parametrize("page", ["api.md", "migration.md", "performance.md", "troubleshooting.md", "huggingface.md"])
def test_relative_links_resolve(page):
    text = open(os.path.join(DOC, page), encoding="utf-8").read()
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert os.path.exists(os.path.join(DOC, target)), f"{page} links to missing {target}"
