#!/usr/bin/env bash
# The GPU acceptance run for issue 44: the three workflows (trtexec, Torch-TensorRT, TF-TRT)
# end to end. For each: trt:plan, the build in NVIDIA's container, Triton serving all three,
# Trellis serving the bridges and ensembles, one image classified through each ensemble, then
# throughput through Trellis (the bridge) against Triton's own on the same tensor, same machine.
#
#   scripts/gpu-acceptance.sh [--release 23.01] [--workflows trtexec,torch-trt,tf-trt]
#
# Needs: an NVIDIA GPU (nvidia-smi), Docker with the NVIDIA runtime, NVIDIA's tensorrt, pytorch,
# tensorflow and tritonserver containers of the release (pulled, or pullable), node and pnpm.
# Where any is missing it lists every missing one and exits 2, running nothing.
set -euo pipefail

release=23.01
workflows=trtexec,torch-trt,tf-trt
while [ $# -gt 0 ]; do
  case "$1" in
    --release) release="$2"; shift 2 ;;
    --workflows) workflows="$2"; shift 2 ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "gpu-acceptance: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done
IFS=, read -r -a wanted <<<"$workflows"

container_for() {
  case "$1" in
    trtexec) echo "nvcr.io/nvidia/tensorrt:$release-py3" ;;
    torch-trt) echo "nvcr.io/nvidia/pytorch:$release-py3" ;;
    tf-trt) echo "nvcr.io/nvidia/tensorflow:$release-tf2-py3" ;;
    *) echo "gpu-acceptance: unknown workflow $1 (trtexec, torch-trt, tf-trt)" >&2; exit 64 ;;
  esac
}
triton_model_for() {
  case "$1" in trtexec) echo resnet50_trt ;; torch-trt) echo resnet50_torchtrt ;; tf-trt) echo resnet50_tftrt ;; esac
}
for w in "${wanted[@]}"; do container_for "$w" >/dev/null; done
suffix_for() {
  case "$1" in trtexec) echo _trt ;; torch-trt) echo _torchtrt ;; tf-trt) echo _tftrt ;; esac
}

# --- What is missing: checked with shell builtins only, so it can say so on any machine. ---
missing=()
command -v node >/dev/null 2>&1 || missing+=("node (Node 20) is not on PATH")
command -v pnpm >/dev/null 2>&1 || missing+=("pnpm is not on PATH")
if ! command -v nvidia-smi >/dev/null 2>&1; then
  missing+=("no NVIDIA GPU: nvidia-smi is not on PATH (the NVIDIA driver is not installed)")
elif ! nvidia-smi -L >/dev/null 2>&1; then
  missing+=("no NVIDIA GPU: nvidia-smi -L lists none")
fi
if ! command -v docker >/dev/null 2>&1; then
  missing+=("no Docker: docker is not on PATH")
elif ! docker info >/dev/null 2>&1; then
  missing+=("Docker is installed but its daemon does not answer (docker info fails)")
else
  docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia ||
    missing+=("Docker has no nvidia runtime (install the NVIDIA Container Toolkit)")
  for image in "nvcr.io/nvidia/tritonserver:$release-py3" $(for w in "${wanted[@]}"; do container_for "$w"; done); do
    docker image inspect "$image" >/dev/null 2>&1 || docker pull -q "$image" >/dev/null 2>&1 ||
      missing+=("NVIDIA container $image is neither pulled nor pullable (docker login nvcr.io?)")
  done
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu-acceptance: cannot run the GPU end-to-end check here; missing:" >&2
  for m in "${missing[@]}"; do echo "  - $m" >&2; done
  echo "Nothing was built or started. On a machine with all of the above: scripts/gpu-acceptance.sh --release $release" >&2
  exit 2
fi

# --- Everything is here: run it. ---
cd "$(dirname "$0")/.."
work=$(mktemp -d)
pids=()
triton_id=""
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$triton_id" ] && docker stop "$triton_id" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

pnpm models:fetch
pnpm turbo build --filter=@trellis/server... --filter=@trellis/client...
for w in "${wanted[@]}"; do
  echo "== $w: plan and build in $(container_for "$w")"
  pnpm trt:plan --workflow "$w" --release "$release"
  model=$(triton_model_for "$w")
  if [ "$w" = trtexec ]; then
    build=$(pnpm --silent trt:plan --workflow trtexec --release "$release" --dry-run 2>/dev/null | paste -sd'&' | sed 's/&/ \&\& /g')
  else
    build="python models/gpu/recipes/$model.py"
  fi
  docker run --gpus all --rm --user "$(id -u):$(id -g)" -e HOME=/tmp -v "$PWD:/work" -w /work \
    "$(container_for "$w")" bash -c "$build"
done

echo "== Triton $release on ports 8100-8102, serving models/gpu/triton"
triton_id=$(docker run -d --gpus all --rm -p 8100:8000 -p 8101:8001 -p 8102:8002 \
  -v "$PWD/models/gpu/triton:/models" "nvcr.io/nvidia/tritonserver:$release-py3" \
  tritonserver --model-repository=/models --exit-on-error=false)
for w in "${wanted[@]}"; do
  model=$(triton_model_for "$w")
  for _ in $(seq 1 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:8100/v2/models/$model/ready")" = 200 ] && break
    sleep 1
  done
  [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:8100/v2/models/$model/ready")" = 200 ] ||
    { echo "gpu-acceptance: Triton did not load $model; its log:" >&2; docker logs "$triton_id" | tail -40 >&2; exit 1; }
done

echo "== Trellis on ports 8000-8002, serving models and models/gpu/trellis"
node apps/server/dist/main.js --model-repository models --model-repository models/gpu/trellis >"$work/trellis.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' localhost:8000/v2/health/ready)" = 200 ] && break
  sleep 1
done

image=samples/images/chelsea.jpg
# Inferences/Second (perf_analyzer's CSV column 2) at concurrency 8. $1: the client's global flags, $2: perf's.
perf_of() {
  # shellcheck disable=SC2086 # word splitting of the flag strings is meant
  node apps/client/dist/main.js $1 perf --concurrency-range 8 -p 10000 -f "$work/perf.csv" $2 >/dev/null
  tail -1 "$work/perf.csv" | cut -d, -f2
}
printf '%-10s %-28s %-34s %s\n' workflow "Triton direct (infer/s)" "Trellis bridge, same tensor (infer/s)" "Trellis ensemble, JPEG (infer/s)"
for w in "${wanted[@]}"; do
  model=$(triton_model_for "$w")
  bridge="resnet50_inference$(suffix_for "$w")"
  ensemble="resnet50_ensemble$(suffix_for "$w")"
  node apps/client/dist/main.js -m "$ensemble" classify "$image"
  direct=$(perf_of "-u localhost:8101 -m $model -b 8" "")
  bridged=$(perf_of "-u localhost:8001 -m $bridge -b 8" "")
  whole=$(perf_of "-u localhost:8001 -m $ensemble" "--input-data $image")
  printf '%-10s %-28s %-34s %s\n' "$w" "$direct" "$bridged" "$whole"
done
echo "(batch 8 at concurrency 8 for the first two columns; figures from pnpm client perf, this machine)"
