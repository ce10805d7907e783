#!/usr/bin/env bash
# `make image-test`: build the CPU image for real and serve the walkthrough's example decision from it.
#
# No registry is reachable here, so the base is a Debian root filesystem made with debootstrap and
# imported into podman (cached under ~/.cache), and the llama-cpp-python wheel that `make` built is
# handed to the image build. Like the llama.cpp DLC base, that base sets LD_LIBRARY_PATH=/opt/llama.cpp/bin,
# and it holds empty decoys of libllama/libggml there: an image that does not reset the variable cannot load
# llama.cpp. The model is packaged by model_build from the embedded GGUF, served over loopback HTTP, then
# unpacked and mounted at /opt/ml/model as SageMaker does. The server must run the CPU kernels ggml rates best for
# this machine's CPU among the variants the wheel ships (the /ping and result fields, and the one libggml-cpu-*.so
# the server maps).
#
# IMAGE_TEST_FLAVOR=gpu builds container/Dockerfile.gpu on its real base (the llama.cpp DLC, CUDA) instead and
# serves the decision on the machine's NVIDIA GPU: it needs public ECR and NVIDIA's package repository, a GPU
# with a driver for the base's CUDA version, and podman with the NVIDIA container toolkit's CDI devices
# (nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml). It compiles llama.cpp with CUDA (about an hour).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
: "${LLAMA_WHEEL_CACHE:?set by make: the folder holding the llama-cpp-python wheel}"
FLAVOR=${IMAGE_TEST_FLAVOR:-cpu}
CACHE=${IMAGE_TEST_CACHE:-$HOME/.cache/decision-adapter/image-test}
SUITE=bookworm
BASE_TAG=localhost/decision-adapter-base:$SUITE-dlc-env
IMAGE=localhost/decision-adapter:$FLAVOR-test
PODMAN=(podman --runtime runc)
case "$FLAVOR" in
    cpu) DEVICES=(); GPU_LAYERS=0 ;;
    gpu) DEVICES=(--device nvidia.com/gpu=all); GPU_LAYERS=-1; PODMAN=(podman) ;;
    *) echo "image-test: IMAGE_TEST_FLAVOR must be cpu or gpu, not $FLAVOR" >&2; exit 2 ;;
esac
ULIMITS=(--ulimit nofile=20000:20000 --ulimit nproc=4096:4096)
WORK=$(mktemp -d)
CONTAINER=""

say() { printf '\n== %s\n' "$*"; }
cleanup() {
    if [ -n "$CONTAINER" ]; then "${PODMAN[@]}" rm -f "$CONTAINER" >/dev/null 2>&1 || true; fi
    [ -n "${HTTP_PID:-}" ] && kill "$HTTP_PID" 2>/dev/null || true
    rm -f container/wheels/*.whl
    rm -rf "$WORK"
}
trap cleanup EXIT

if [ "$FLAVOR" = cpu ]; then
    say "base image: Debian $SUITE with Python, from a local root filesystem"
    if ! "${PODMAN[@]}" image exists "$BASE_TAG"; then
        if [ ! -x "$CACHE/rootfs-$SUITE/usr/bin/python3" ]; then
            rm -rf "$CACHE/rootfs-$SUITE.partial" && mkdir -p "$CACHE"
            debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
                "$SUITE" "$CACHE/rootfs-$SUITE.partial" http://deb.debian.org/debian
            mv "$CACHE/rootfs-$SUITE.partial" "$CACHE/rootfs-$SUITE"
        fi
        # The base trusts the certificate authorities this machine trusts, so that pip inside the image
        # build reaches PyPI the way the host's pip does (some networks inspect TLS with their own CA).
        cp /etc/ssl/certs/ca-certificates.crt "$CACHE/rootfs-$SUITE/etc/ssl/certs/ca-certificates.crt"
        printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$CACHE/rootfs-$SUITE/etc/pip.conf"
        # What the DLC base does: its own llama.cpp libraries on LD_LIBRARY_PATH (here empty decoys).
        mkdir -p "$CACHE/rootfs-$SUITE/opt/llama.cpp/bin"
        for lib in libllama.so libggml.so libggml-base.so libggml-cpu.so; do
            : > "$CACHE/rootfs-$SUITE/opt/llama.cpp/bin/$lib"
        done
        tar -C "$CACHE/rootfs-$SUITE" -c . | "${PODMAN[@]}" import --change 'ENV LD_LIBRARY_PATH=/opt/llama.cpp/bin' - "$BASE_TAG"
    fi
    BASE_ID=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$BASE_TAG")
    echo "base $BASE_TAG = $BASE_ID"

    say "image: container/Dockerfile with the cached llama-cpp-python wheel"
    cp "$LLAMA_WHEEL_CACHE"/llama_cpp_python-*.whl container/wheels/
    "${PODMAN[@]}" build --isolation=chroot "${ULIMITS[@]}" -f container/Dockerfile \
        --build-arg "BASE_IMAGE=$BASE_ID" -t "$IMAGE" container
else
    say "image: container/Dockerfile.gpu on its pinned base (compiles llama.cpp with CUDA)"
    "${PODMAN[@]}" build "${ULIMITS[@]}" -f container/Dockerfile.gpu -t "$IMAGE" container
fi

say "checks on the image: non-root user, serve entry point, no model inside"
[ "$("${PODMAN[@]}" image inspect --format '{{.Config.User}}' "$IMAGE")" = 10001 ]
[ "$("${PODMAN[@]}" image inspect --format '{{json .Config.Cmd}}' "$IMAGE")" = '["serve"]' ]
# Read whole before grep: with pipefail, `grep -q` quitting at the first match can fail podman with SIGPIPE.
IMAGE_ENV=$("${PODMAN[@]}" image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE")
if ! grep -qx 'LD_LIBRARY_PATH=' <<<"$IMAGE_ENV"; then
    echo "image-test: the image does not reset LD_LIBRARY_PATH (the base's llama.cpp would shadow the adapter's)" >&2
    exit 1
fi
if "${PODMAN[@]}" run --rm "${ULIMITS[@]}" --entrypoint sh "$IMAGE" -c 'find / -xdev -name "*.gguf" | grep .'; then
    echo "image-test: the image contains a GGUF model" >&2; exit 1
fi

say "model: package the embedded GGUF with model_build, as CodeBuild would"
GGUF_DIR=$("$PY" -c 'from decision_adapter.decisions.model_files import embedded_model_dir; print(embedded_model_dir())')
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
HTTP_PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$PY" -m http.server --bind 127.0.0.1 --directory "$GGUF_DIR" "$HTTP_PORT" >/dev/null 2>&1 &
HTTP_PID=$!
SHA=$(sha256sum "$GGUF_DIR/$GGUF" | cut -d' ' -f1)
cat > "$WORK/pins.json" <<PINS
{"default": "smollm2-135m", "pins": {"smollm2-135m": {
  "description": "SmolLM2-135M-Instruct Q4_1, the embedded test model",
  "url": "http://127.0.0.1:$HTTP_PORT/$GGUF", "sha256": "$SHA", "bytes": $(stat -c %s "$GGUF_DIR/$GGUF")}}}
PINS
"$PY" -m model_build package --pins "$WORK/pins.json" --no-upload --output "$WORK/out" --work-dir "$WORK/dl"
mkdir -p "$WORK/model"
tar -xzf "$WORK"/out/smollm2-135m/*/model.tar.gz -C "$WORK/model"
chmod -R a+rX "$WORK/model"
ls -l "$WORK/model"

say "run: serve the example decision from the image"
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
CONTAINER=$("${PODMAN[@]}" run -d "${ULIMITS[@]}" "${DEVICES[@]}" -p "127.0.0.1:$PORT:8080" \
    -v "$WORK/model:/opt/ml/model:ro" "$IMAGE" serve)
for _ in $(seq 240); do
    if curl -sf "http://127.0.0.1:$PORT/ping" >/dev/null; then break; fi
    if [ "$("${PODMAN[@]}" inspect --format '{{.State.Running}}' "$CONTAINER")" != true ]; then break; fi
    sleep 0.5
done
if ! curl -sf "http://127.0.0.1:$PORT/ping"; then
    "${PODMAN[@]}" logs "$CONTAINER" >&2; echo "image-test: the container never became ready" >&2; exit 1
fi
echo
curl -sf "http://127.0.0.1:$PORT/invocations" -H 'Content-Type: application/json' \
    -d @examples/support-route.json > "$WORK/result.json" || { "${PODMAN[@]}" logs "$CONTAINER" >&2; exit 1; }
curl -sf "http://127.0.0.1:$PORT/ping" > "$WORK/ping.json"
# The CPU kernels the container must run: on the CPU flavour the best variant for this machine's CPU, as ggml scores
# the variants the wheel ships (the container runs on this CPU); the GPU image's CPU backend is built in.
if [ "$FLAVOR" = cpu ]; then
    VARIANT=$("$PY" -c 'from decision_adapter.engine import backends; import llama_cpp, pathlib
files = backends.variant_files(pathlib.Path(llama_cpp.__file__).parent / "lib")
scores = {name: backends.probe(path) for name, path in files.items()}
print(max(scores, key=scores.get))')
else
    VARIANT=built-in
fi
echo "expected CPU variant: $VARIANT"
"$PY" - "$WORK/result.json" "$SHA" "$GPU_LAYERS" "$WORK/ping.json" "$VARIANT" <<'CHECK'
import json, math, sys
result = json.load(open(sys.argv[1]))["result"]
ping = json.load(open(sys.argv[4]))
assert result["option_ids"] == ["account_access", "billing", "sales"], result
assert math.isclose(sum(result["probabilities"]), 1.0, abs_tol=1e-9), result
assert result["model"]["sha256"] == sys.argv[2] and result["model"]["source"], result["model"]
assert result["model"]["gpu_layers"] == int(sys.argv[3]), result["model"]
assert result["model"]["cpu_variant"] == ping["cpu_variant"] == sys.argv[5], (result["model"], ping)
assert result["model"]["cpu_features"] == ping["cpu_features"] and ping["cpu_features"], (result["model"], ping)
print("probabilities:", dict(zip(result["option_ids"], (round(p, 4) for p in result["probabilities"]))))
print("model:", result["model"]["file"], result["model"]["sha256"][:12], "from", result["model"]["source"])
print("kernels:", ping["cpu_variant"], " ".join(ping["cpu_features"]))
CHECK

say "libraries: the server maps llama.cpp from the adapter's venv only"
MAPPED=$("${PODMAN[@]}" exec "$CONTAINER" sh -c 'cat /proc/[0-9]*/maps 2>/dev/null' \
    | awk '$6 ~ /\/lib(llama|ggml)[^/]*\.so/ {print $6}' | sort -u)
echo "$MAPPED"
[ -n "$MAPPED" ] || { echo "image-test: no llama.cpp library is mapped in the container" >&2; exit 1; }
if echo "$MAPPED" | grep -v '^/opt/adapter/venv/'; then
    echo "image-test: llama.cpp libraries from outside the adapter's venv are loaded (above)" >&2; exit 1
fi
if [ "$FLAVOR" = cpu ]; then
    CPU_LIBS=$(echo "$MAPPED" | grep '/libggml-cpu' || true)
    if [ "$(echo "$CPU_LIBS" | sed 's#.*/##')" != "libggml-cpu-$VARIANT.so" ]; then
        echo "image-test: the server maps CPU backends [$CPU_LIBS], not libggml-cpu-$VARIANT.so alone" >&2; exit 1
    fi
fi

say "stop: SIGTERM, graceful exit"
"${PODMAN[@]}" stop --time 60 "$CONTAINER" >/dev/null
[ "$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$CONTAINER")" = 0 ]
echo "image-test: OK"
