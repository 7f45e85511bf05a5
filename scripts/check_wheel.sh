#!/usr/bin/env bash
# The package as users install it: build the wheel from the repo's files, install it alone into a
# fresh virtual environment, and run the CLI from there, so a prompt template, worked example or
# default TOML missing from the wheel fails here and not on a user's machine.
#
# The venv sees the system site-packages (torch and every other dependency are not installed
# again) but negsynth itself comes only from the wheel: the commands run from an empty working
# directory without PYTHONPATH, and the script checks that `negsynth` and its package data load
# from the venv's site-packages (an editable install of a checkout, a .pth in the system
# site-packages, would otherwise answer instead). 7-12 s on 2 loaded cores; offline.
#
#   bash scripts/check_wheel.sh            # from anywhere; KEEP=1 keeps the temp folder
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1
T0=$SECONDS
TMP=$(mktemp -d "${TMPDIR:-/tmp}/negsynth-wheel.XXXXXX")
if [[ -z "${KEEP:-}" ]]; then trap 'rm -rf "$TMP"' EXIT; else echo "check_wheel: keeping $TMP" >&2; fi
fail() {
  echo "check_wheel: FAIL: $*" >&2
  exit 1
}

# 1. the source a release would hold: tracked files plus new ones git does not ignore (not build/,
# *.egg-info or runs/), copied out so the build writes nothing into the checkout
mkdir -p "$TMP/src" "$TMP/dist" "$TMP/work"
if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # (a tracked file deleted in the work tree is left out, as a commit of the work tree would)
  git -C "$REPO" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do if [[ -f $f ]]; then printf '%s\0' "$f"; fi; done |
    xargs -0 cp --parents -t "$TMP/src"
else
  cp -r "$REPO/." "$TMP/src/"
  rm -rf "$TMP/src/build" "$TMP/src"/*.egg-info
fi

# 2. the wheel: with the installed setuptools (offline); with pip's isolated build (which fetches
# setuptools) only when that fails
if ! "$PY" -m pip wheel --no-deps --no-build-isolation --no-index -q -w "$TMP/dist" "$TMP/src" >"$TMP/build.log" 2>&1; then
  echo "check_wheel: offline build failed (see below); retrying with an isolated build" >&2
  tail -5 "$TMP/build.log" >&2
  "$PY" -m pip wheel --no-deps -q -w "$TMP/dist" "$TMP/src" || fail "pip wheel could not build negsynth"
fi
WHEEL=$(ls "$TMP"/dist/negsynth-*.whl)

# 3. every data file under negsynth/ is in the wheel (pyproject.toml's [tool.setuptools.package-data])
"$PY" - "$TMP/src" "$WHEEL" <<'EOF' || fail "package data missing from the wheel (declare it in pyproject.toml's [tool.setuptools.package-data])"
import sys, zipfile
from pathlib import Path
src, wheel = Path(sys.argv[1]), sys.argv[2]
skip = {".py", ".pyc", ".pyi"}
want = {p.relative_to(src).as_posix() for p in (src / "negsynth").rglob("*") if p.is_file() and p.suffix not in skip and "__pycache__" not in p.parts}
have = set(zipfile.ZipFile(wheel).namelist())
missing = sorted(want - have)
for m in missing:
    print(f"  not in the wheel: {m}", file=sys.stderr)
print(f"check_wheel: {len(want) - len(missing)} of {len(want)} data files under negsynth/ in the wheel", file=sys.stderr)
sys.exit(1 if missing else 0)
EOF

# 4. a fresh venv that reuses the system's packages, the wheel installed into it without deps
"$PY" -m venv --system-site-packages --without-pip "$TMP/venv"
VPY="$TMP/venv/bin/python"
(cd "$TMP/work" && env -u PYTHONPATH "$VPY" -m pip install --no-deps --no-index -q "$WHEEL") || fail "pip install of the wheel"
SITE=$(cd "$TMP/work" && env -u PYTHONPATH "$VPY" -c "import sysconfig; print(sysconfig.get_path('purelib'))")

# from here on: an empty cwd, no PYTHONPATH, no user site, offline
cd "$TMP/work"
unset PYTHONPATH
export PYTHONNOUSERSITE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
NS="$TMP/venv/bin/negsynth"
[[ -x "$NS" ]] || fail "the wheel installed no negsynth command (project.scripts)"

"$VPY" - "$SITE" <<'EOF' || fail "negsynth does not load from the wheel (an editable install or PYTHONPATH shadows it)"
import sys
from importlib import resources
import negsynth, negsynth.prompts
site = sys.argv[1]
where = {"negsynth": negsynth.__file__, "templates": str(resources.files("negsynth.prompts").joinpath("templates")), "defaults": str(resources.files("negsynth").joinpath("defaults"))}
bad = {k: v for k, v in where.items() if not v.startswith(site)}
for k, v in bad.items():
    print(f"  {k} loads from {v}, not from {site}", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF

# the sample corpus the notebook and `negsynth.sample_corpus()` read, from the package API
"$VPY" -c "import negsynth; p = negsynth.sample_corpus(); n = sum(1 for _ in open(p)); assert n == 50, (p, n)" || fail "negsynth.sample_corpus() (package data samples/documents.jsonl)"
"$NS" --version | grep -qx "negsynth [0-9][0-9a-z.+]*" || fail "negsynth --version: $("$NS" --version 2>&1)"
# the built-in config: defaults/default.toml
"$NS" config --json >config.json || fail "negsynth config"
"$VPY" -c "import json; c = json.load(open('config.json')); assert c['llm']['base_url'] and c['pipeline']['stages'], c" || fail "negsynth config printed no [llm]/[pipeline]"
# estimate renders every LLM stage's real prompts: templates and worked examples
"$NS" estimate -d est --json >estimate.json || fail "negsynth estimate"
"$VPY" - <<'EOF' || fail "negsynth estimate rendered no prompts"
import json
est = json.load(open("estimate.json"))
stages = est["stages"]
assert stages["brainstorm"]["prompt_tokens"] > 0 and stages["generate"]["prompt_tokens"] > 0, stages
EOF
# one real stage, brainstorm then generate, against the tests' fake OpenAI server (a file of the
# repo, not of the package: it runs in this script's python, the stages in the venv's negsynth)
"$PY" - "$REPO/tests" "$NS" <<'EOF' || fail "brainstorm/generate from the wheel against the fake server"
import json, subprocess, sys
sys.path.insert(0, sys.argv[1])
from fake_openai import FakeOpenAI, always_valid
ns = sys.argv[2]
with FakeOpenAI(always_valid) as srv:
    sets = ["--set", f"llm.base_url={srv.base_url}", "--set", "generate.examples=10", "--set", "pipeline.stages=['brainstorm','generate']"]
    for stage in ("brainstorm", "generate"):
        r = subprocess.run([ns, stage, "-d", "run", "--json", *sets], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            sys.exit(f"{stage} exited {r.returncode}: {r.stderr[-2000:]}")
        stats = json.loads(r.stdout)
        assert stats.get("valid", 0) > 0, stats
        print(f"check_wheel: {stage} from the wheel: {stats['valid']} valid", file=sys.stderr)
EOF
echo "check_wheel: ok: $(basename "$WHEEL") installed alone into a venv, CLI and package data work ($((SECONDS - T0)) s)" >&2
