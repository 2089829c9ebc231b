"""The fine-tuning notebook (examples/fine_tuning.ipynb) runs top to bottom in the training
environment, and the model fine-tuned in onnxruntime predicts what the model fine-tuned in Keras
with the same steps predicts."""
from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("onnxruntime.training", reason="needs onnxruntime's training build (the training slice)")

import nbclient  # noqa: E402
import nbformat  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


def test_fine_tuning_notebook():
    book = nbformat.read(os.path.join(EXAMPLES, "fine_tuning.ipynb"), as_version=4)
    nbclient.NotebookClient(book, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": EXAMPLES}}).execute()
    texts = []
    for cell in book.cells:
        for output in cell.get("outputs", []):
            assert output.get("output_type") != "error", output
            texts.append(output.get("text", "") or output.get("data", {}).get("text/plain", ""))
    text = "\n".join(texts)
    assert "1 recurrent loop(s): 1 fused into native nodes, 0 left as Loop" in text
    assert "wrote training_model.onnx" in text and "wrote checkpoint" in text
    (error,) = [float(v) for v in re.findall(r"max abs error vs Keras fine-tuning ([0-9.e+-]+)", text)]
    assert error < 1e-4, text
    first, last = map(float, re.search(r"onnxruntime loss: first batch ([0-9.]+), last batch ([0-9.]+)", text).groups())
    assert last < first, text  # fine-tuning learned the new task
    (loss_gap,) = [float(v) for v in re.findall(r"largest loss difference per step ([0-9.e+-]+)", text)]
    assert loss_gap < 1e-4, text
