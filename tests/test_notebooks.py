"""The example notebooks run top to bottom, and what they print is what they claim."""
from __future__ import annotations

import os
import re

import nbclient
import nbformat

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _run(name: str) -> str:
    """Execute a notebook in examples/ and return all its text output."""
    book = nbformat.read(os.path.join(EXAMPLES, name), as_version=4)
    client = nbclient.NotebookClient(book, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": EXAMPLES}})
    client.execute()
    texts = []
    for cell in book.cells:
        for output in cell.get("outputs", []):
            assert output.get("output_type") != "error", output
            texts.append(output.get("text", "") or output.get("data", {}).get("text/plain", ""))
    return "\n".join(texts)


def _errors(text: str) -> list:
    return [float(value) for value in re.findall(r"max abs error(?: vs Keras)? ([0-9.e+-]+)", text)]


def test_quickstart():
    text = _run("quickstart.ipynb")
    assert text.count("3 recurrent loop(s): 3 fused into native nodes, 0 left as Loop") == 2  # dynamic, batch 1
    assert "input shape: [1, " in text  # the batch-1 export
    errors = _errors(text)
    assert len(errors) == 3 and max(errors) < 1e-5


def test_text_classifier_with_masks():
    text = _run("text_classifier_masking.ipynb")
    assert "LSTM direction: bidirectional" in text
    assert "mask: Embedding(mask_zero=True)" in text
    errors = _errors(text)
    assert len(errors) == 2 and max(errors) < 1e-5
    assert "(pad)" in text


def test_performance():
    text = _run("performance.ipynb")
    assert "| gru-uni-plain-b1 |" in text and "| lstm-uni-masked-b1 |" in text
    ratios = [float(v) for v in re.findall(r"stock/ours = ([0-9.]+)", text)]
    assert len(ratios) == 2 and all(r > 0 for r in ratios)


def test_streaming_notebook():
    text = _run("streaming.ipynb")
    whole = [float(v) for v in re.findall(r"max abs error vs Keras \(whole signal\) ([0-9.e+-]+)", text)]
    stateful = [float(v) for v in re.findall(r"max abs error vs stateful Keras ([0-9.e+-]+)", text)]
    assert len(whole) == 1 and whole[0] < 1e-5, whole
    assert len(stateful) == 1 and stateful[0] < 1e-5, stateful
    assert "'gru/h_in'" in text and "'gru/h_out'" in text  # the ONNX input and output names
    assert "states in: gru/h_in, out: gru/h_out" in text  # the report's row
    assert "stateful; states in: gru/h_in" in text  # the stateful model streams by itself
    assert re.search(r"per-frame latency: median [0-9.]+ ms", text)
    assert "refused: " in text and "both_ways" in text


def test_quantization_notebook():
    text = _run("quantization.ipynb")
    rows = dict((name, (float(accuracy), float(error), float(size))) for name, accuracy, error, size in re.findall(
        r"\| (float|weights|dynamic|TFLite int8) \| accuracy ([0-9.]+) \| max abs error vs Keras ([0-9.e+-]+) \| "
        r"([0-9.]+) KB \|", text))
    assert set(rows) == {"float", "weights", "dynamic", "TFLite int8"}, text[-3000:]
    assert rows["float"][1] < 1e-4
    for mode in ("weights", "dynamic"):
        accuracy, error, size = rows[mode]
        assert accuracy >= rows["float"][0] - 0.01 and size < 0.6 * rows["float"][2], rows
        assert error <= 1.5 * rows["TFLite int8"][1], rows  # as accurate as TFLite's own int8, give or take
    assert "quantized (dynamic)" in text
