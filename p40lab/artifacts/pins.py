"""The versions and file names of the installer doubles.

These restate the stack pins of ``p40fleet.spec`` (the lab must not import the product);
``tests/test_lab_pins.py`` holds each one to the spec's default so that the two cannot drift
apart silently.
"""

from __future__ import annotations

DRIVER_VERSION = "525.147.05"
EXTRA_DRIVER_VERSIONS = ("525.125.06",)
CUDA_VERSION = "11.8.0"
CUDA_SHORT = ".".join(CUDA_VERSION.split(".")[:2])  # 11.8: /usr/local/cuda-11.8, nvcc's release
CUDA_DRIVER = "520.61.05"  # the driver bundled in cuda_11.8.0_520.61.05_linux.run
CUDNN_VERSION = "8.9.7.29"
MINICONDA_VERSION = "py310_24.11.1-0"
CONDA_VERSION = "24.11.1"
# A later Miniconda that bundles the conda-anaconda-tos plugin (from 25.5.1 on): an extra
# artifact, for tests of the ToS decision against an installed conda that has `conda tos`.
MINICONDA_TOS_VERSION = "py310_25.5.1-0"
CONDA_TOS_VERSION = "25.5.1"
# The real cuda_11.8.0_520.61.05_linux.run is 4336730777 bytes (~4.3 GB) and unpacks into
# --tmpdir (default /tmp); the double demands that much free space unless the lab overrides it
# (env P40LAB_CUDA_UNPACK_BYTES at mirror build time sets the baked default, at run time on the
# host it overrides it).
CUDA_UNPACK_BYTES_REAL = 4336730777


def driver_filename(version: str) -> str:
    return f"NVIDIA-Linux-x86_64-{version}.run"


CUDA_FILENAME = f"cuda_{CUDA_VERSION}_{CUDA_DRIVER}_linux.run"
CUDNN_TOP = f"cudnn-linux-x86_64-{CUDNN_VERSION}_cuda11-archive"
CUDNN_FILENAME = f"{CUDNN_TOP}.tar.xz"


def miniconda_filename(version: str) -> str:
    return f"Miniconda3-{version}-Linux-x86_64.sh"


MINICONDA_FILENAME = miniconda_filename(MINICONDA_VERSION)
MINICONDA_TOS_FILENAME = miniconda_filename(MINICONDA_TOS_VERSION)
