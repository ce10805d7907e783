#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (target tools/server) from the llama.cpp source that the pinned
# llama-cpp-python source package vendors. Built once into a cache folder; prints the binary's path.
#
# The generation baseline is the peer a user would run, so it gets the best kernels for this CPU: -DGGML_NATIVE=ON
# (the kernels llama.cpp's release build would pick here, compiled for this CPU alone; one CPU backend, so the build
# takes minutes, not the all-variants build's), AMX left out as the adapter leaves it out. A native binary runs only on CPUs like the one that built it, so its
# cache folder is keyed by this CPU's feature flags as well. LLAMA_SERVER_CMAKE_ARGS replaces the flags, e.g.
# "-DGGML_CUDA=ON" on a GPU machine, or "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" for the
# adapter's former AVX2-only kernels. With --flags it prints the flags it would build with and builds nothing; with
# --path, the binary's path, built or not. One build at a time per destination: a second call waits for the first
# (flock) and then finds the binary (the test session starts a build in the background; the harness asks again).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VERSION=$(sed -n 's/^llama-cpp-python==//p' container/requirements.txt)
# -DGGML_NATIVE=ON, or on a CPU with AMX every instruction set of its best variant named instead (cpu_variants.py:
# llama.cpp's AMX kernels died at the first decode on such a CPU, and -march=native would compile them).
FLAGS=${LLAMA_SERVER_CMAKE_ARGS:-$("$PYTHON" container/decision_adapter/engine/cpu_variants.py native-cmake)}
if [ "${1:-}" = "--flags" ]; then  # the flags a build here uses (benchmark results name them), nothing built
    printf '%s\n' "$FLAGS"
    exit 0
fi
KEY=$FLAGS
case " $FLAGS " in
    *" -DGGML_NATIVE=ON "*) KEY="$FLAGS $(grep -m1 '^flags' /proc/cpuinfo)" ;;
esac
FLAGS_ID=$(printf '%s' "$KEY" | sha256sum | cut -c1-12)
DEST=${LLAMA_SERVER_CACHE:-$HOME/.cache/decision-adapter/llama-server-$VERSION-$FLAGS_ID}

if [ "${1:-}" = "--path" ]; then
    echo "$DEST/bin/llama-server"
    exit 0
fi
if [ -x "$DEST/bin/llama-server" ]; then
    echo "$DEST/bin/llama-server"
    exit 0
fi
mkdir -p "$(dirname "$DEST")"
exec 9> "$DEST.lock"
flock 9
if [ -x "$DEST/bin/llama-server" ]; then  # built by the call that held the lock
    echo "$DEST/bin/llama-server"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "Building llama-server from llama-cpp-python $VERSION's vendored llama.cpp into $DEST (several minutes)..." >&2
# The source package, downloaded once for every build (container/llama_wheel.py keeps it).
tar -xzf "$("$PYTHON" container/llama_wheel.py sdist)" -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
# shellcheck disable=SC2086
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release $FLAGS -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >&2
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
rm -rf "$DEST.partial" && mkdir -p "$DEST.partial/bin"
cp "$work/build/bin/llama-server" "$DEST.partial/bin/"
rm -rf "$DEST" && mv "$DEST.partial" "$DEST"
echo "$DEST/bin/llama-server"
