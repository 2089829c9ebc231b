"""onnxruntime first run where a native crash cannot end the caller.

A conversion checks its model in onnxruntime: the loadability check creates a session, the output
shape check and verification run it. onnxruntime has ended the whole process (a segmentation fault or
an abort: nothing to catch) while creating a session on graphs a converter wrote (a float16 ``MatMul``
of a time-major swap, measured on 1.23-1.32) and while running an LSTM node on a batch of no rows; a
crash there takes a notebook's kernel or a server's process with it, with no report and no file. So once
per conversion, before any of those checks, a child process (an interpreter importing onnxruntime and
numpy only) creates the session with the same options and runs it on the checks' own rounds of inputs.
If the child ends by a signal, the conversion raises :class:`RuntimeCrashed` naming the runtime, the
signal, the stage and the model's recurrent rows, and nothing is written; the command line exits 3.
Otherwise the checks run in the caller's process as before: the same session options and inputs, which
the child survived. An error onnxruntime raises (a model it refuses) is not a crash: the caller's own
checks report it as they always did.

The child stays for the next conversion of the same process (starting an interpreter and importing
onnxruntime costs more than most checks: about 0.15-0.5 s each time): it takes one model at a time from
its standard input and keeps nothing of one model for the next (each session is dropped before it answers).
A child that crashed, timed out or exited is replaced by a new one at the next check; a forked process
starts its own; the child ends when its caller does (its input closes).
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional, Sequence

import numpy as np
import onnx

from .errors import ConversionError

# run in the child, once per request line (a JSON list: the model's path, the feeds' path): the session (the
# options of probes.session), then each round's feeds; "session" when it loaded, "done" when it ran them all
_CHILD = r"""
import json
import sys
import numpy as np
import onnxruntime as ort

def check(path, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception:
        return
    print("session", flush=True)
    with np.load(feeds) as data:
        rounds = {}
        for key in data.files:
            number, name = key.split("/", 1)
            rounds.setdefault(int(number), {})[name] = data[key]
    for number in sorted(rounds):
        try:
            session.run(None, rounds[number])
        except Exception:
            pass

for line in sys.stdin:
    check(*json.loads(line))
    print("done", flush=True)
"""
TIMEOUT = 1800  # seconds: a child still checking after this is stopped and left to the caller's own checks


class RuntimeCrashed(ConversionError):
    """onnxruntime ended its process on the converted model (in a child process: the caller goes on)."""

    exit_code = 3  # the command line's status for it (its internal error's): not bad input, not a failed check


class _Child:
    """The checking interpreter of this process: one request at a time."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
        self.owner = os.getpid()

    def check(self, path: str, feeds: str) -> Optional[tuple]:
        """(the signal, whether the session was created) when the child ended by a signal on this model;
        else None (it answered, exited of itself, or timed out and was stopped: an ended child is replaced at
        the next check). Its answer is read from the pipe itself, unbuffered: a line read ahead into a buffer
        would leave the pipe empty while the answer waits."""
        try:
            self.process.stdin.write(json.dumps([path, feeds]).encode() + b"\n")
            self.process.stdin.flush()
        except OSError:  # it had ended before this request
            return None
        answer, deadline, out = b"", time.monotonic() + TIMEOUT, self.process.stdout.fileno()
        while b"done\n" not in answer:
            if not select.select([out], [], [], max(0.0, deadline - time.monotonic()))[0]:
                self.process.kill()
                self.process.wait()
                return None
            chunk = os.read(out, 4096)
            if not chunk:  # it ended on this model
                status = self.process.wait()
                return (-status, b"session\n" in answer) if status < 0 else None
            answer += chunk
        return None


_child: Optional[_Child] = None
_lock = threading.Lock()


def _crashed(path: str, feeds: str) -> Optional[tuple]:
    """Check in this process's child (started, or replaced when it ended or belongs to the process this one
    was forked from): (the signal, whether the session was created) when it crashed, else None."""
    global _child
    with _lock:
        if _child is None or _child.owner != os.getpid() or _child.process.poll() is not None:
            _child = _Child()
        return _child.check(path, feeds)


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
        crashed = _crashed(os.path.abspath(path), os.path.abspath(feeds))
    if crashed is not None:
        raise RuntimeCrashed(crash_message(*crashed, rows))


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
