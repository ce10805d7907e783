"""container/Dockerfile and Dockerfile.gpu read statically (no image is built here; make image-test builds the CPU one).

The GPU image cannot be built on this machine, so what would make it fail on SageMaker is checked in its text:
the CUDA toolkit that compiles llama.cpp is the major version of the base's CUDA runtime (recorded as a build
argument beside the base's digest), the architectures are those stacks/ allows in the GPU pools, and both
images reset the base's LD_LIBRARY_PATH so that the adapter loads the llama.cpp it was built with.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stacks import instance_types

CONTAINER = Path(__file__).resolve().parents[2] / "container"
DOCKERFILES = ("Dockerfile", "Dockerfile.gpu")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)   # (INSTRUCTION, arguments)

    def arguments(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]


def parse(path: Path) -> Dockerfile:
    """Instructions with their continuation lines joined; comment lines dropped (as BuildKit does)."""
    logical, pending = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or (not line.strip() and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    global_args, stages = {}, []
    for line in logical:
        instruction, _, arguments = line.strip().partition(" ")
        instruction, arguments = instruction.upper(), arguments.strip()
        if instruction == "FROM":
            base, _, name = arguments.partition(" AS ")
            stages.append(Stage(base=base.strip(), name=name.strip() or None))
        elif not stages and instruction == "ARG":
            key, _, value = arguments.partition("=")
            global_args[key] = value.strip('"')
        else:
            stages[-1].instructions.append((instruction, arguments))
    return Dockerfile(global_args=global_args, stages=stages)


def env_of(stage: Stage) -> dict[str, str]:
    """The ENV settings of a stage (KEY=VALUE pairs, later ones win)."""
    found = {}
    for arguments in stage.arguments("ENV"):
        for pair in shlex.split(arguments):
            key, _, value = pair.partition("=")
            found[key] = value
    return found


@pytest.fixture(scope="module", params=DOCKERFILES)
def dockerfile(request):
    return parse(CONTAINER / request.param)


@pytest.fixture(scope="module")
def gpu():
    return parse(CONTAINER / "Dockerfile.gpu")


def test_the_base_is_pinned_by_digest(dockerfile):
    assert re.fullmatch(r"public\.ecr\.aws/deep-learning-containers/llama-cpp@sha256:[0-9a-f]{64}",
                        dockerfile.global_args["BASE_IMAGE"])
    assert all(stage.base == "${BASE_IMAGE}" for stage in dockerfile.stages)


def test_the_runtime_stage_resets_ld_library_path(dockerfile):
    """The DLC bases set LD_LIBRARY_PATH=/opt/llama.cpp/bin; its libllama/libggml must not shadow the adapter's."""
    runtime = env_of(dockerfile.stages[-1])
    assert runtime["LD_LIBRARY_PATH"] == ""
    assert runtime["PATH"].startswith("/opt/adapter/venv/bin:")


def test_the_base_cuda_version_is_recorded_beside_the_digest(gpu):
    assert re.fullmatch(r"[0-9]+\.[0-9]+", gpu.global_args["BASE_CUDA_VERSION"])
    assert gpu.global_args["BASE_CUDA_VERSION"] == instance_types.GPU_IMAGE_CUDA_VERSION
    (build,) = [stage for stage in gpu.stages if stage.name == "build"]
    assert "BASE_CUDA_VERSION" in build.arguments("ARG")


def build_script(gpu: Dockerfile) -> str:
    (build,) = [stage for stage in gpu.stages if stage.name == "build"]
    (script,) = [args for args in build.arguments("RUN") if "pip wheel" in args]
    return script


def test_the_toolkit_is_the_base_cuda_major(gpu):
    """The toolkit package is derived from BASE_CUDA_VERSION (never written out), as the build's shell derives it."""
    script = build_script(gpu)
    assert not re.search(r"cuda-toolkit-[0-9]", script), "a hard-coded toolkit version"
    derivation = [part.strip() for part in script.split(";") if part.strip().startswith(("cuda_major=", "toolkit="))]
    assert len(derivation) == 2
    for version in (gpu.global_args["BASE_CUDA_VERSION"], "12.8", "13.1"):
        shell = f'BASE_CUDA_VERSION={version}; {"; ".join(derivation)}; echo "$cuda_major $toolkit"'
        major, toolkit = subprocess.run(["sh", "-c", shell], capture_output=True, text=True,
                                        check=True).stdout.split()
        assert major == version.split(".")[0]
        assert toolkit == f"cuda-toolkit-{version.replace('.', '-')}"
        assert re.fullmatch(rf"cuda-toolkit-{major}-[0-9]+", toolkit)
    assert 'dnf install -y "${toolkit}"' in script


def test_the_build_stops_unless_nvcc_and_the_wheel_are_the_base_major(gpu):
    script = build_script(gpu)
    assert '[ "${nvcc_major}" = "${cuda_major}" ]' in script
    assert 'grep -qx "libcudart.so.${cuda_major}"' in script


def test_the_runtime_stage_resolves_the_cuda_backend_at_build_time(gpu):
    runtime = gpu.stages[-1]
    assert any("--from=build /cuda-libs/" in copy for copy in runtime.arguments("COPY"))
    (check,) = [args for args in runtime.arguments("RUN") if "ldd" in args]
    assert "ldconfig" in check and "grep -v 'libcuda\\.so\\.1'" in check
    assert env_of(runtime)["ADAPTER_GPU_LAYERS"] == "-1"


def test_cuda_architectures_are_the_ones_stacks_allow(gpu):
    (build,) = [stage for stage in gpu.stages if stage.name == "build"]
    (architectures,) = [args for args in build.arguments("ARG") if args.startswith("CUDA_ARCHITECTURES=")]
    compiled = tuple(int(a) for a in architectures.split("=", 1)[1].strip('"').split(";"))
    assert compiled == instance_types.GPU_IMAGE_CUDA_ARCHITECTURES
    assert "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}" in build_script(gpu)


def test_both_images_run_serve_unprivileged(dockerfile):
    runtime = dockerfile.stages[-1]
    assert runtime.arguments("USER")[-1] == "10001"
    assert runtime.arguments("CMD") == ['["serve"]'] and runtime.arguments("ENTRYPOINT") == ["[]"]


def llama_wheel():
    """container/llama_wheel.py, the builder of the wheels `make` installs and `make image-test` hands in."""
    spec = importlib.util.spec_from_file_location("llama_wheel", CONTAINER / "llama_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cpu_image_compiles_llama_cpp_as_the_wheel_builder_does():
    """The image built from source and the wheel `make image-test` hands in carry the same kernels: every CPU
    variant, loaded at start-up (engine/backends.py)."""
    cpu = parse(CONTAINER / "Dockerfile")
    (flags,) = [args for args in cpu.stages[-1].arguments("ARG") if args.startswith("LLAMA_CMAKE_ARGS=")]
    image_flags = flags.split("=", 1)[1].strip('"')
    builder = llama_wheel()
    assert image_flags == builder.IMAGE_CMAKE_ARGS
    # the image's variant set is ggml's whole list, built from the unedited flags
    assert builder.cmake_args(builder.IMAGE_CMAKE_ARGS, builder.resolve_variants("all")) == image_flags
    assert {"-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON", "-DGGML_NATIVE=OFF"} <= set(image_flags.split())
