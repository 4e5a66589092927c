"""The notebooks run top to bottom (executed with nbclient, small settings injected after their parameters
cell, as papermill does), and the committed .ipynb files are their jupytext sources with outputs stripped."""

import importlib.util
import json
import os

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need nbformat (the 'test' extra)")
nbclient = pytest.importorskip("nbclient", reason="the notebook tests need nbclient (the 'test' extra)")
jupytext = pytest.importorskip("jupytext", reason="the notebook tests need jupytext (the 'test' extra)")
pytest.importorskip("transformers", reason="the notebooks need transformers (the 'test' extra)")

NOTEBOOKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "notebooks")


def run_notebook(name: str, overrides: str) -> str:
    """Execute notebooks/<name>.py with ``overrides`` run right after the parameters cell; return its stdout."""
    notebook = jupytext.read(os.path.join(NOTEBOOKS, name + ".py"))
    index = next(i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", []))
    notebook.cells.insert(index + 1, nbformat.v4.new_code_cell(overrides))
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": NOTEBOOKS}})
    client.execute()  # raises CellExecutionError, with the cell and the traceback, if any cell fails
    return "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for output in cell.get("outputs", []) if output.get("name") == "stdout")


def test_committed_ipynb_match_their_sources():
    spec = importlib.util.spec_from_file_location("notebook_sync", os.path.join(NOTEBOOKS, "sync.py"))
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    assert len(sync.sources()) == 4
    assert sync.main(["--check"]) == 0, "run: python notebooks/sync.py"
    for source in sync.sources():
        notebook = nbformat.read(source[:-3] + ".ipynb", as_version=4)
        assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")


@pytest.mark.slow
def test_01_sparse_roberta_mlm(tmp_path):
    out = run_notebook("01_sparse_roberta_mlm",
                       f"MAX_STEPS = 5; HIDDEN = 32; BATCH = 8; OUTPUT_DIR = {str(tmp_path)!r}")
    assert "whole model" in out and "every tensor bit-identical: True; largest output difference: 0" in out
    assert "reloaded layers: BlockSparseLinear" in out


@pytest.mark.slow
def test_02_prune_bert(tmp_path):
    out = run_notebook("02_prune_bert_2to4_and_blocks",
                       f"DENSE_STEPS = 8; RECOVER_STEPS = 3; HIDDEN = 32; TIMING_REPEATS = 2; "
                       f"OUTPUT_DIR = {str(tmp_path)!r}")
    assert "12 layers -> ['SemiStructuredLinear']" in out and "12 layers -> ['BlockSparseLinear']" in out
    assert out.count("every tensor bit-identical: True; largest output difference: 0\n") == 2


def test_03_without_results_plots_nothing(tmp_path):
    out = run_notebook("03_benchmark_plots", f"RESULTS_DIR = {str(tmp_path)!r}; SAVE_PLOTS = True")
    assert "No benchmark results" in out
    assert os.listdir(tmp_path) == []


def test_03_plots_the_records_it_is_given(tmp_path):
    # A result file in bench_linear.py's format, made up for this test only (it never leaves tmp_path).
    records = [dict(method="dense", phase="forward", dtype="bf16", m=64, k=128, n=128, ms=1.0)]
    for block, base in ((32, 1.0), (64, 2.0)):
        for density in (0.25, 0.5):
            records.append(dict(method="ours", phase="forward", dtype="bf16", m=64, k=128, n=128, block=block,
                                density=density, ms=0.5, speedup=base / density))
    meta = dict(gpu="Test GPU", torch="x", cuda="y", quick=True)
    (tmp_path / "bench_linear_Test_GPU.json").write_text(json.dumps(dict(meta=meta, records=records)))
    (tmp_path / "other.json").write_text(json.dumps([1, 2]))
    out = run_notebook("03_benchmark_plots", f"RESULTS_DIR = {str(tmp_path)!r}; SAVE_PLOTS = True")
    assert "skipping other.json" in out
    assert "Test GPU" in out and "4 records" not in out and "5 records" in out
    assert "    32 |   4.00x |   2.00x" in out and "    64 |   8.00x |   4.00x" in out
    assert (tmp_path / "bench_linear_Test_GPU.speedup.png").stat().st_size > 1000


@pytest.mark.slow
def test_04_accuracy_study():
    out = run_notebook("04_accuracy_study", "STEPS = 6; FINETUNE_STEPS = 2; D_MODEL = 32")
    assert "2:4 + fine-tune" in out and "(target within 1 %)" in out
    assert "RigL at least as good as" in out or "RigL worse than" in out
