"""Facts about SageMaker ML instance types that the configuration and the endpoint stack act on.

Only what the checks need: the vCPU count and the physical cores behind it (llama.cpp runs one thread per core:
a second on the core's other hyperthread shares its vector units and only adds synchronisation; docs/adapter.md,
"CPU kernels and threads"), the CPU architecture (the adapter and the llama.cpp DLC images are x86-64 only), the NVIDIA GPU's CUDA compute capability (the GPU image is
compiled for a fixed set, Dockerfile.gpu's CUDA_ARCHITECTURES) and whether the instance has local NVMe
instance storage (SageMaker rejects a volume KmsKeyId for those: their disks are encrypted in hardware).
"""

from __future__ import annotations

import re

INSTANCE_TYPE = re.compile(r"^ml\.(?P<family>[a-z0-9]+(?:-[a-z0-9]+)?)\.(?P<size>medium|large|xlarge|[1-9][0-9]*xlarge)$")

# Dockerfile.gpu: ARG CUDA_ARCHITECTURES="75;80;86;89;90" and ARG BASE_CUDA_VERSION=13.0, the CUDA version of
# its base, which the toolkit that compiles llama.cpp matches (tests/images keeps these in step).
GPU_IMAGE_CUDA_ARCHITECTURES: tuple[int, ...] = (75, 80, 86, 89, 90)
GPU_IMAGE_CUDA_VERSION = "13.0"

# ProductionVariant.InferenceAmiVersion for NVIDIA GPUs: (NVIDIA driver, the newest CUDA version it runs), as
# botocore's service model documents them (a test compares).
GPU_INFERENCE_AMIS: dict[str, tuple[int, str]] = {
    "al2-ami-sagemaker-inference-gpu-2": (535, "12.2"),
    "al2-ami-sagemaker-inference-gpu-2-1": (535, "12.2"),
    "al2-ami-sagemaker-inference-gpu-3-1": (550, "12.4"),
    "al2023-ami-sagemaker-inference-gpu-4-1": (580, "13.0"),
}

# TransformResources.TransformAmiVersion: the NVIDIA driver of each AMI a Batch Transform host can run, as
# botocore's service model documents them (a test compares). None runs CUDA 13.
GPU_TRANSFORM_AMIS: dict[str, int] = {
    "al2-ami-sagemaker-batch-gpu-470": 470,
    "al2-ami-sagemaker-batch-gpu-535": 535,
}


def driver_for_cuda(cuda: str) -> int:
    """The oldest NVIDIA driver among the inference AMIs that runs ``cuda`` (the GPU image's needs, in the AMIs'
    own terms): 580 for CUDA 13.0."""
    major_minor = tuple(map(int, cuda.split(".")))
    return min(driver for driver, newest in GPU_INFERENCE_AMIS.values()
               if tuple(map(int, newest.split("."))) >= major_minor)


# NVIDIA families: the GPU and its compute capability (sm_XY as the integer XY).
NVIDIA_FAMILIES: dict[str, tuple[str, int]] = {
    "p2": ("K80", 37),
    "p3": ("V100", 70),
    "p3dn": ("V100", 70),
    "g4dn": ("T4", 75),
    "p4d": ("A100", 80),
    "p4de": ("A100", 80),
    "g5": ("A10G", 86),
    "g6": ("L4", 89),
    "gr6": ("L4", 89),
    "g6e": ("L40S", 89),
    "p5": ("H100", 90),
    "p5e": ("H200", 90),
    "p5en": ("H200", 90),
    "p6-b200": ("B200", 100),
    "p6e-gb200": ("GB200", 100),
    "p6-b300": ("B300", 103),
    "g7e": ("RTX PRO 6000 Blackwell", 120),
}

# Families with local NVMe instance storage (EC2 instance-store volumes), besides the "d" variants
# (c5d, m6id, r7gd, g4dn, p4d, ...) that the pattern below recognises.
_INSTANCE_STORAGE_FAMILIES = frozenset({
    "g5", "g6", "g6e", "gr6", "g7", "g7e", "p5", "p5e", "p5en", "p6-b200", "p6-b300", "p6e-gb200",
    "trn1", "trn1n", "trn2", "dl1",
})
_D_VARIANT = re.compile(r"^[a-z]+[0-9]+[a-z]*d[a-z]*$")
_GRAVITON = re.compile(r"^[a-z]+[0-9]+g[a-z]*$")          # c6g, c7gd, m8g, r6gd, c6gn, ...
_ACCELERATED = re.compile(r"^(g|gr|p|inf|trn|dl)[0-9]")


def family(instance_type: str) -> str:
    match = INSTANCE_TYPE.match(instance_type)
    if not match:
        raise ValueError(f"not an ML instance type: {instance_type!r}")
    return match["family"]


def vcpus(instance_type: str) -> int:
    """vCPUs of an ML instance type: medium 1 (t2.medium 2), large 2, xlarge 4, Nxlarge 4N."""
    match = INSTANCE_TYPE.match(instance_type)
    if not match:
        raise ValueError(f"not an ML instance type: {instance_type!r}")
    size = match["size"]
    if size == "medium":
        return 2 if match["family"] == "t2" else 1
    if size == "large":
        return 2
    if size == "xlarge":
        return 4
    return 4 * int(size[: -len("xlarge")])


# x86 families whose vCPUs are whole cores (no simultaneous multithreading): AMD's 7th generation and later (c7a,
# m7a, r7a, ...), and t2. Every other x86 family has two vCPUs per core; Graviton has one (EC2's instance type
# documentation, "CPU options": threads per core).
_ONE_THREAD_PER_CORE = re.compile(r"^([a-z]+[7-9]a[a-z]*|t2)$")


def physical_cores(instance_type: str) -> int:
    """Physical cores of an ML instance type: its vCPUs, halved where each core runs two hyperthreads."""
    name, count = family(instance_type), vcpus(instance_type)
    if is_graviton(instance_type) or _ONE_THREAD_PER_CORE.match(name):
        return count
    return max(1, count // 2)


def is_graviton(instance_type: str) -> bool:
    return bool(_GRAVITON.match(family(instance_type)))


def is_accelerated(instance_type: str) -> bool:
    return bool(_ACCELERATED.match(family(instance_type)))


def nvidia_gpu(instance_type: str) -> tuple[str, int] | None:
    """(GPU name, compute capability) for NVIDIA families, None for anything else."""
    return NVIDIA_FAMILIES.get(family(instance_type))


def has_instance_storage(instance_type: str) -> bool:
    """True where the instance has local NVMe storage, so SageMaker refuses a volume KmsKeyId.

    Accelerated families missing from the tables count as having instance storage: leaving the key out
    never fails CreateEndpointConfig (SageMaker then encrypts with its own key), setting it might.
    """
    name = family(instance_type)
    if name in _INSTANCE_STORAGE_FAMILIES or _D_VARIANT.match(name):
        return True
    return is_accelerated(instance_type) and name not in NVIDIA_FAMILIES and not name.startswith("inf")


def gpus(instance_type: str) -> int:
    """NVIDIA GPUs of the instance types the GPU image supports (g4dn, g5, g6, g6e, gr6, p4d/p4de, p5*).

    The g families have one GPU up to 16xlarge, four at 12xlarge and 24xlarge, eight at 48xlarge (and g4dn.metal);
    the p4/p5 sizes SageMaker offers have eight. The GPU utilization alarm's threshold scales with it.
    """
    name = family(instance_type)
    if nvidia_gpu(instance_type) is None:
        raise ValueError(f"not an NVIDIA GPU instance type: {instance_type!r}")
    if name.startswith("p"):
        return 8
    size = INSTANCE_TYPE.match(instance_type)["size"]
    return {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8}.get(size, 1)
