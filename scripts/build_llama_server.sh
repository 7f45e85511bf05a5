#!/usr/bin/env bash
# Build llama.cpp's own `llama-server`, the embedded LLM.
#
# Source: the llama.cpp that llama-cpp-python's sdist vendors (vendor/llama.cpp), pinned by version
# (LLAMA_CPP_PYTHON_VERSION, default below) so every machine serves the same llama.cpp; only the sdist
# is downloaded, llama-cpp-python itself is not built or installed. Build: native
# (-DGGML_NATIVE=ON: AVX-512 etc. where the CPU has them), a portable build when that fails, no
# curl / OpenSSL / web UI, static, only the `llama-server` target, ggml's own thread pool instead
# of OpenMP (so negsynth can pass --poll 0: no threads spinning on a core another process needs).
# The native build leaves out AMX (-mno-amx-*): a CPU under a hypervisor may advertise AMX that the
# guest cannot use (Firecracker here: the binary dies with SIGSEGV / SIGILL at its first tile
# instruction, `ldtilecfg`).
# Installed next to the Python interpreter's scripts (`sysconfig.get_path("scripts")`), where
# negsynth looks first. Idempotent: skips when that binary exists and was built from the same
# sdist version with the same flags (stamp file `llama-server.negsynth-version` beside it).
# About 6 min on 2 cores. Env: PYTHON, LLAMA_SERVER_JOBS (parallel compile jobs),
# LLAMA_SERVER_BUILD_DIR (work dir; default ~/.cache/negsynth/llama-server-<version>),
# LLAMA_SERVER_FORCE=1 (rebuild), LLAMA_SERVER_PORTABLE=1 (skip the native build).
#
# `build_llama_server.sh --check GGUF`: start the installed binary on that model and wait for its
# warm-up decode. A native build can compile instructions the CPU lists but the machine cannot run
# (AMX or AVX-512 FP16 inside some virtual machines): the server then dies with SIGILL/SIGSEGV on
# its first decode, while `--version` still works. On such a death the binary is rebuilt portable
# and checked again; a binary that passed is stamped and not checked again.
set -euo pipefail
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
PY=${PYTHON:-python3}

check() {  # check <binary> <gguf>: 0 when the server loads the model and answers /health
  local bin=$1 gguf=$2 port pid ok=1
  port=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  "$bin" --model "$gguf" --host 127.0.0.1 --port "$port" --threads 1 --parallel 1 --ctx-size 512 >/tmp/llama-server-check.$$.log 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    if "$PY" -c "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2).status != 200)" 2>/dev/null; then
      ok=0
      break
    fi
    sleep 0.5
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  [[ $ok == 0 ]] || tail -3 /tmp/llama-server-check.$$.log >&2
  rm -f /tmp/llama-server-check.$$.log
  return $ok
}

VER=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
BIN_DIR=$("$PY" -c "import sysconfig; print(sysconfig.get_path('scripts'))")
DEST="$BIN_DIR/llama-server"
STAMP="$DEST.negsynth-version"
TAG="$VER no-amx"  # a binary built before AMX was left out is rebuilt once
if [[ "${1:-}" == "--check" ]]; then
  GGUF=${2:?usage: build_llama_server.sh --check MODEL.gguf}
  [[ -x "$DEST" ]] || { echo "llama-server: not built ($DEST); run scripts/build_llama_server.sh" >&2; exit 1; }
  [[ -f "$DEST.negsynth-checked" && "$(cat "$DEST.negsynth-checked")" == "$TAG" ]] && exit 0
  if check "$DEST" "$GGUF"; then
    echo "$TAG" >"$DEST.negsynth-checked"
    echo "llama-server: runs on this CPU ($DEST)"
    exit 0
  fi
  echo "llama-server: the native build does not run on this CPU (it compiled instructions the machine refuses); rebuilding portable ..." >&2
  LLAMA_SERVER_FORCE=1 LLAMA_SERVER_PORTABLE=1 PYTHON="$PY" bash "$0"
  check "$DEST" "$GGUF" || { echo "llama-server: the portable build does not run either; see the build log under ~/.cache/negsynth" >&2; exit 1; }
  echo "$TAG" >"$DEST.negsynth-checked"
  exit 0
fi
if [[ -z "${LLAMA_SERVER_FORCE:-}" && -x "$DEST" && -f "$STAMP" && "$(cat "$STAMP")" == "$TAG" ]] && "$DEST" --version >/dev/null 2>&1; then
  echo "llama-server: already built from llama-cpp-python $VER ($DEST)"
  exit 0
fi

WORK=${LLAMA_SERVER_BUILD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/negsynth/llama-server-$VER}
mkdir -p "$WORK"
SRC="$WORK/llama_cpp_python-$VER/vendor/llama.cpp"
if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
  SDIST="$WORK/llama_cpp_python-$VER.tar.gz"
  if [[ ! -f "$SDIST" ]]; then
    "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$WORK"
  fi
  tar -xzf "$SDIST" -C "$WORK" "llama_cpp_python-$VER/vendor/llama.cpp"
fi

# cmake >= 3.21 (the floor llama-cpp-python itself builds with); from PyPI when missing or older
CMAKE=$(command -v cmake || true)
if [[ -z "$CMAKE" ]] || ! "$CMAKE" --version | head -1 | awk '{split($3, v, "."); exit !(v[1] > 3 || (v[1] == 3 && v[2] >= 21))}'; then
  "$PY" -m pip install "cmake>=3.21"
  CMAKE="$BIN_DIR/cmake"
fi
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
JOBS=${LLAMA_SERVER_JOBS:-$(nproc)}

NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
build() {  # build <native ON|OFF> <dir>
  local flags=()
  [[ "$1" == ON ]] && flags=(-DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX")
  "$CMAKE" -S "$SRC" -B "$2" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" \
    -DGGML_NATIVE="$1" -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -Wno-dev >"$2.log" 2>&1 \
  && "$CMAKE" --build "$2" --target llama-server -j "$JOBS" >>"$2.log" 2>&1 \
  && "$2/bin/llama-server" --version >>"$2.log" 2>&1
}

t0=$SECONDS
if [[ -z "${LLAMA_SERVER_PORTABLE:-}" ]]; then
  echo "llama-server: building llama.cpp from llama-cpp-python $VER (native; log $WORK/build-native.log) ..."
fi
if [[ -z "${LLAMA_SERVER_PORTABLE:-}" ]] && build ON "$WORK/build-native"; then
  OUT="$WORK/build-native/bin/llama-server"
else
  [[ -n "${LLAMA_SERVER_PORTABLE:-}" ]] || echo "llama-server: the native build failed (see $WORK/build-native.log); building portable ..."
  [[ -z "${LLAMA_SERVER_PORTABLE:-}" ]] || echo "llama-server: building llama.cpp from llama-cpp-python $VER (portable; log $WORK/build-portable.log) ..."
  build OFF "$WORK/build-portable" || { echo "llama-server: the portable build failed too; see the build log under ~/.cache/negsynth" >&2; exit 1; }
  OUT="$WORK/build-portable/bin/llama-server"
fi
install -m 755 "$OUT" "$DEST"
echo "$TAG" >"$STAMP"
rm -f "$DEST.negsynth-checked"
echo "llama-server: installed $DEST ($((SECONDS - t0)) s)"
