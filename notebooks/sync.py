"""Regenerate the .ipynb notebooks from their jupytext sources (*.py, percent format), outputs stripped.

    python notebooks/sync.py          # write notebooks/NN_*.ipynb from notebooks/NN_*.py
    python notebooks/sync.py --check  # exit 1 if an .ipynb is out of date (tests/test_notebooks.py checks this)

The .py files are the ones to edit and review; the .ipynb files are there to be opened in Jupyter or on GitHub.
"""

import glob
import os
import sys

import jupytext
import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))


def sources():
    return sorted(glob.glob(os.path.join(HERE, "[0-9][0-9]_*.py")))


def notebook_for(source: str) -> str:
    """The .ipynb text for a jupytext source, outputs and execution counts empty."""
    notebook = jupytext.read(source)
    for index, cell in enumerate(notebook.cells):
        cell.id = f"cell-{index:02d}"  # stable ids (nbformat would draw random ones), so the check is exact
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nbformat.writes(notebook) + "\n"


def main(argv) -> int:
    stale = []
    for source in sources():
        target = source[:-3] + ".ipynb"
        text = notebook_for(source)
        current = open(target, encoding="utf-8").read() if os.path.exists(target) else None
        if current != text:
            stale.append(os.path.basename(target))
            if "--check" not in argv:
                with open(target, "w", encoding="utf-8") as handle:
                    handle.write(text)
    if stale:
        print(("out of date: " if "--check" in argv else "wrote: ") + ", ".join(stale))
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
