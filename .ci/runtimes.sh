#!/usr/bin/env bash
# The runtimes slice: one environment per runtime a target writes for (each pins its own onnx, numpy and
# torch), made on Python 3.11, then the runtime tests of tests/test_runtime_targets.py run from the newest
# stack's environment ($1: its python), each runtime's interpreter named by TF2ONNX_RNN_<RUNTIME>_PYTHON.
# A runtime whose packages cannot be installed is left out, saying so: its tests then skip, naming why.
set -uo pipefail
stack_python=$1
base_python=$2
root=$(cd "$(dirname "$0")/.." && pwd)
where="${TMPDIR:-/tmp}/tf2onnx-rnn-ci-runtimes"
rm -rf "$where"
mkdir -p "$where"

install() {  # install NAME PIP-ARGS...: a venv with the runtime, or a line saying why not
    local name=$1; shift
    "$base_python" -m venv "$where/$name" && "$where/$name/bin/python" -m pip install --quiet --upgrade "pip>=24" \
        && "$where/$name/bin/python" -m pip install --quiet "$@" && return 0
    echo "!! $name could not be installed: its tests skip" >&2
    return 1
}
install iree "iree-base-compiler==3.13.0" "iree-base-runtime==3.13.0" "onnx>=1.16,<1.24" "numpy>=1.26,<2.5" \
    && export TF2ONNX_RNN_IREE_PYTHON="$where/iree/bin/python"
install tvm "apache-tvm==0.27.0.post1" "onnx>=1.16,<1.24" "numpy>=1.26,<2.5" \
    && export TF2ONNX_RNN_TVM_PYTHON="$where/tvm/bin/python"
# pnnx imports torch: 2.13.0's CPU build (newer releases are CUDA builds)
install ncnn "torch==2.13.0" "pnnx==20261020" "ncnn==1.0.20261020" "onnx>=1.16,<1.24" "numpy>=1.26,<2.5" \
    && export TF2ONNX_RNN_NCNN_PYTHON="$where/ncnn/bin/python"
# rknn-toolkit2 2.5 imports torch: 2.13.0's CPU build (newer releases are CUDA builds); it asks for torch<=2.4 (a CUDA build of several GB) and opencv-python: its other requirements
# as it states them, torch's CPU build and the headless opencv, and the toolkit itself without dependencies
install rknn "protobuf>=4.21.6,<=4.25.4" "psutil>=5.9" "ruamel.yaml>=0.17.21" "scipy>=1.9.3" "tqdm>=4.64.1" \
        "opencv-python-headless>=4.5.5.64" "fast-histogram>=0.11" "numpy>=1.26,<=1.26.4" "onnx==1.18.0" \
        "onnxruntime>=1.17,<1.27" "torch==2.13.0" "setuptools<70" \
    && "$where/rknn/bin/python" -m pip install --quiet --no-deps "rknn-toolkit2==2.5.0" \
    && export TF2ONNX_RNN_RKNN_PYTHON="$where/rknn/bin/python"
cd "$root"
"$stack_python" -m pytest -n 2 -p no:cacheprovider tests/test_runtime_targets.py -k "in_its_runtime or verify_with"
