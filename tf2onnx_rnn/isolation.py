"""onnxruntime first run where a native crash cannot end the caller.

A conversion checks its model in onnxruntime: the loadability check creates a session, the output
shape check and verification run it. onnxruntime has ended the whole process (a segmentation fault or
an abort: nothing to catch) while creating a session on graphs a converter wrote (a float16 ``MatMul``
of a time-major swap, measured on 1.23-1.32) and while running an LSTM node on a batch of no rows; a
crash there takes a notebook's kernel or a server's process with it, with no report and no file. So once
per conversion, before any of those checks, a child process (a fresh interpreter importing onnxruntime
and numpy only, about 0.15 s) creates the session with the same options and runs it on the checks' own
rounds of inputs. If the child ends by a signal, the conversion raises :class:`RuntimeCrashed` naming the
runtime, the signal, the stage and the model's recurrent rows, and nothing is written; the command line
exits 3. Otherwise the checks run in the caller's process as before: the same session options and inputs,
which the child survived. An error onnxruntime raises (a model it refuses) is not a crash: the caller's
own checks report it as they always did.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from typing import Optional, Sequence

import numpy as np
import onnx

from .errors import ConversionError

# run in the child: the session (the options of probes.session), then each round's feeds
_CHILD = r"""
import sys
import numpy as np
import onnxruntime as ort

options = ort.SessionOptions()
options.log_severity_level = 3
try:
    session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
except Exception:
    sys.exit(0)
print("session", flush=True)
with np.load(sys.argv[2]) as data:
    rounds = {}
    for key in data.files:
        number, name = key.split("/", 1)
        rounds.setdefault(int(number), {})[name] = data[key]
for number in sorted(rounds):
    try:
        session.run(None, rounds[number])
    except Exception:
        pass
print("runs", flush=True)
"""
TIMEOUT = 1800  # seconds: a child still loading after this is left to the caller's own checks


class RuntimeCrashed(ConversionError):
    """onnxruntime ended its process on the converted model (in a child process: the caller goes on)."""

    exit_code = 3  # the command line's status for it (its internal error's): not bad input, not a failed check


def check_survives(model_proto: onnx.ModelProto, rounds: Sequence[dict], rows: Sequence = (),
                   model_path: Optional[str] = None) -> None:
    """Create an onnxruntime session on the model and run it on ``rounds`` (feeds by input name) in a child
    process; raise :class:`RuntimeCrashed` when the child ends by a signal. ``rows``: the report's rows,
    named in the message; ``model_path``: the model already written (a model over protobuf's 2 GB limit,
    with its external data beside it), else the model is written to a temporary file."""
    with tempfile.TemporaryDirectory(prefix="tf2onnx_rnn_") as folder:
        path = model_path or os.path.join(folder, "model.onnx")
        if model_path is None:
            with open(path, "wb") as stream:
                stream.write(model_proto.SerializeToString())
        feeds = os.path.join(folder, "feeds.npz")
        np.savez(feeds, **{f"{number}/{name}": np.asarray(value) for number, feed in enumerate(rounds)
                           for name, value in feed.items()})
        try:
            done = subprocess.run([sys.executable, "-c", _CHILD, path, feeds], capture_output=True, text=True,
                                  timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            return
    if done.returncode >= 0:
        return
    raise RuntimeCrashed(crash_message(-done.returncode, "session" in done.stdout, rows))


def crash_message(number: int, loaded: bool, rows: Sequence = ()) -> str:
    """One line: the runtime, the signal, the stage, the recurrent rows of the model."""
    import onnxruntime

    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    stage = "running the converted model on the checks' inputs" if loaded else \
        "creating a session for the converted model"
    layers = "; ".join(f"{row.layer} ({row.kind} -> {row.became})" for row in rows) or "no recurrent layer"
    return (f"onnxruntime {onnxruntime.__version__} ended its process with {name} {stage} (its recurrent layers: "
            f"{layers}); it ran in a child process, so this one goes on, and nothing was written")
