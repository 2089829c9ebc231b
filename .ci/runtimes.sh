#!/usr/bin/env bash
# The runtimes slice: one environment per runtime a target writes for (each pins its own onnx, numpy and
# torch), made on Python 3.11, then the runtime tests (tests/test_runtime_targets.py: streamed chunks and
# verification in a runtime; tests/test_runtime_claims.py: every runtime a report names runs the model) run
# from the newest stack's environment, each runtime's interpreter named by TF2ONNX_RNN_<RUNTIME>_PYTHON.
# A runtime whose packages cannot be installed fails the install, naming it (outside CI, its tests skip, naming why).
#   runtimes.sh install BASE_PYTHON      make the environments (CI does this while the main suite runs)
#   runtimes.sh test STACK_PYTHON        run the tests with the environments made
set -uo pipefail
phase=$1
root=$(cd "$(dirname "$0")/.." && pwd)
where="${TMPDIR:-/tmp}/tf2onnx-rnn-ci-runtimes"

if [ "$phase" = test ]; then
    for name in iree tvm ncnn rknn; do
        if [ -f "$where/$name/ready" ]; then
            export "TF2ONNX_RNN_$(echo "$name" | tr '[:lower:]' '[:upper:]')_PYTHON=$where/$name/bin/python"
        fi
    done
    cd "$root"
    # every runtime the reports name must be here: a missing one fails its claims' tests (not a skip)
    export TF2ONNX_RNN_RUNTIMES_REQUIRED=1
    exec "$2" -m pytest -n 2 -p no:cacheprovider tests/test_runtime_targets.py tests/test_runtime_claims.py \
        tests/test_parallel_recurrences.py -k "in_its_runtime or verify_with"
fi

base_python=$2
rm -rf "$where"
mkdir -p "$where"
missing=""

install() {  # install NAME PIP-ARGS...: a venv with the runtime, or a line saying why not
    local name=$1; shift
    "$base_python" -m venv "$where/$name" && "$where/$name/bin/python" -m pip install --quiet --upgrade "pip>=24" \
        && "$where/$name/bin/python" -m pip install --quiet "$@" && return 0
    echo "!! $name could not be installed" >&2
    missing="$missing $name"
    return 1
}
install iree "iree-base-compiler==3.13.0" "iree-base-runtime==3.13.0" "onnx>=1.16,<1.24" "numpy>=1.26,<2.5" \
    && touch "$where/iree/ready"
install tvm "apache-tvm==0.27.0.post1" "onnx>=1.16,<1.24" "numpy>=1.26,<2.5" \
    && touch "$where/tvm/ready"
# pnnx imports torch: 2.13.0's CPU build (newer releases are CUDA builds)
install ncnn "torch==2.13.0" "pnnx==20261020" "ncnn==1.0.20261020" "onnx>=1.16,<1.24" "numpy>=1.26,<2.5" \
    && touch "$where/ncnn/ready"
# rknn-toolkit2 2.5 imports torch and pkg_resources: torch 2.13.0's CPU build (newer releases are CUDA builds),
# which needs setuptools>=77.0.3, and a setuptools that still has pkg_resources (<81). The toolkit asks for
# torch<=2.4 (a CUDA build of several GB) and opencv-python: its other requirements as it states them, torch's
# CPU build and the headless opencv, and the toolkit itself without dependencies
install rknn "protobuf>=4.21.6,<=4.25.4" "psutil>=5.9" "ruamel.yaml>=0.17.21" "scipy>=1.9.3" "tqdm>=4.64.1" \
        "opencv-python-headless>=4.5.5.64" "fast-histogram>=0.11" "numpy>=1.26,<=1.26.4" "onnx==1.18.0" \
        "onnxruntime>=1.17,<1.27" "torch==2.13.0" "setuptools>=77.0.3,<81" \
    && "$where/rknn/bin/python" -m pip install --quiet --no-deps "rknn-toolkit2==2.5.0" \
    && touch "$where/rknn/ready"
# every runtime is what this slice exists for: one that could not be installed fails the step, naming it
if [ -n "$missing" ]; then
    echo "!! not installed:$missing" >&2
    exit 1
fi
