#!/bin/sh
# Installs the adapter into /opt/adapter/venv inside an image, on Amazon Linux 2023 (the llama.cpp DLC
# bases) or Debian (local test bases). A llama-cpp-python wheel in /opt/adapter/wheels is used as is;
# without one, the pinned source package is compiled with $CMAKE_ARGS and the compilers are removed again.
set -eu

python=""
for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
        "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        python=$(command -v "$candidate")
        break
    fi
done
[ -n "$python" ] || { echo "install.sh: no Python 3.11 or newer in the base image" >&2; exit 1; }
echo "install.sh: using $python ($("$python" --version))"

have_wheel=no
ls /opt/adapter/wheels/llama_cpp_python-*.whl >/dev/null 2>&1 && have_wheel=yes
build_packages=""
if [ "$have_wheel" = no ]; then
    if command -v dnf >/dev/null 2>&1; then
        build_packages="gcc gcc-c++ make cmake $(basename "$python")-devel"
        dnf install -y $build_packages
    elif command -v apt-get >/dev/null 2>&1; then
        build_packages="build-essential cmake python3-dev"
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $build_packages
    else
        echo "install.sh: no llama-cpp-python wheel and no package manager to install compilers" >&2
        exit 1
    fi
fi

# llama.cpp's CPU backend runs its threads with OpenMP.
if ! ldconfig -p 2>/dev/null | grep -q 'libgomp\.so\.1'; then
    if command -v dnf >/dev/null 2>&1; then
        dnf install -y libgomp
    else
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libgomp1
        rm -rf /var/lib/apt/lists/*
    fi
fi

"$python" -m venv /opt/adapter/venv
/opt/adapter/venv/bin/pip install --no-cache-dir --disable-pip-version-check --upgrade pip
/opt/adapter/venv/bin/pip install --no-cache-dir --disable-pip-version-check \
    --find-links /opt/adapter/wheels -r /opt/adapter/src/requirements.txt
/opt/adapter/venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps /opt/adapter/src

if [ -n "$build_packages" ]; then
    if command -v dnf >/dev/null 2>&1; then dnf remove -y gcc gcc-c++ cmake && dnf clean all; fi
    if command -v apt-get >/dev/null 2>&1; then apt-get purge -y build-essential cmake && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*; fi
fi
rm -rf /opt/adapter/wheels /opt/adapter/src /root/.cache

# The adapter runs as an unprivileged user; /opt/ml/model is mounted read-only by SageMaker.
if command -v useradd >/dev/null 2>&1; then
    useradd --system --uid 10001 --no-create-home --shell /sbin/nologin adapter
else
    echo "adapter:x:10001:10001::/nonexistent:/sbin/nologin" >> /etc/passwd
    echo "adapter:x:10001:" >> /etc/group
fi
