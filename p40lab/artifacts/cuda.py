"""The CUDA toolkit runfile double (``cuda_11.8.0_520.61.05_linux.run``, with its driver)."""

from __future__ import annotations

import json
from pathlib import Path

from p40lab import doubles
from p40lab.artifacts.archive import Tree, fill, makeself
from p40lab.artifacts.driver import build_driver
from p40lab.artifacts.elf import shared_lib
from p40lab.artifacts.pins import CUDA_DRIVER, CUDA_SHORT, CUDA_VERSION, driver_filename


def _version_json() -> str:
    comps = {
        "cuda": ("CUDA SDK", "11.8.20220929"),
        "cuda_cccl": ("CUDA C++ Core Compute Libraries", "11.8.89"),
        "cuda_cudart": ("CUDA Runtime (cudart)", "11.8.89"),
        "cuda_cuobjdump": ("cuobjdump", "11.8.86"),
        "cuda_cupti": ("CUPTI", "11.8.87"),
        "cuda_cuxxfilt": ("CUDA cu++ filt", "11.8.86"),
        "cuda_gdb": ("CUDA GDB", "11.8.86"),
        "cuda_nvcc": ("CUDA NVCC", "11.8.89"),
        "cuda_nvdisasm": ("CUDA nvdisasm", "11.8.86"),
        "cuda_nvml_dev": ("CUDA NVML Headers", "11.8.86"),
        "cuda_nvprune": ("CUDA nvprune", "11.8.86"),
        "cuda_nvrtc": ("CUDA NVRTC", "11.8.89"),
        "cuda_nvtx": ("CUDA NVTX", "11.8.86"),
        "libcublas": ("CUDA cuBLAS", "11.11.3.6"),
        "libcufft": ("CUDA cuFFT", "10.9.0.58"),
        "libcurand": ("CUDA cuRAND", "10.3.0.86"),
        "libcusolver": ("CUDA cuSOLVER", "11.4.1.48"),
        "libcusparse": ("CUDA cuSPARSE", "11.7.5.86"),
        "nvidia_driver": ("NVIDIA Linux Driver", CUDA_DRIVER),
    }
    data = {k: {"name": n, "version": v} for k, (n, v) in comps.items()}
    return json.dumps(data, indent=3, separators=(",", " : ")) + "\n"


CUDA_LIBS = [  # (real file, soname) under targets/x86_64-linux/lib
    ("libcudart.so.11.8.89", "libcudart.so.11.0"),
    ("libcublas.so.11.11.3.6", "libcublas.so.11"),
    ("libcublasLt.so.11.11.3.6", "libcublasLt.so.11"),
    ("libcufft.so.10.9.0.58", "libcufft.so.10"),
    ("libcurand.so.10.3.0.86", "libcurand.so.10"),
    ("libcusparse.so.11.7.5.86", "libcusparse.so.11"),
    ("libnvrtc.so.11.8.89", "libnvrtc.so.11.2"),
]


def build_cuda(kernel_release: str, work: Path, unpack_bytes: int) -> bytes:
    t = Tree()
    tk = "toolkit"
    t.file(f"{tk}/bin/nvcc", fill(doubles.source("nvcc.sh"), CUDA_SHORT=CUDA_SHORT), 0o755)
    t.file(
        f"{tk}/bin/nvcc.profile",
        "\nTOP              = $(_HERE_)/..\n\nNVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice\n\n"
        "LD_LIBRARY_PATH += $(TOP)/lib:\nPATH            += $(TOP)/nvvm/bin:$(_HERE_):\n\n"
        'INCLUDES        +=  "-I$(TOP)/$(_TARGET_DIR_)/include" $(_SPACE_)\n\n'
        'LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)/stubs"'
        ' "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)"\n',
    )
    t.file(
        f"{tk}/bin/cuda-uninstaller",
        "#!/bin/sh\n# p40lab double: removes this toolkit installation\n"
        'top=$(cd "$(dirname "$0")/.." && pwd)\nrm -rf "$top"\n'
        'echo "Successfully uninstalled"\n',
        0o755,
    )
    inc = f"{tk}/targets/x86_64-linux/include"
    t.file(
        f"{inc}/cuda.h",
        "/* p40lab placeholder of cuda.h (CUDA 11.8) */\n#ifndef __cuda_cuda_h__\n"
        "#define __cuda_cuda_h__\n\n#define CUDA_VERSION 11080\n\n#endif\n",
    )
    t.file(
        f"{inc}/cuda_runtime_api.h",
        "/* p40lab placeholder of cuda_runtime_api.h (CUDA 11.8) */\n"
        "#if !defined(__CUDA_RUNTIME_API_H__)\n#define __CUDA_RUNTIME_API_H__\n\n"
        "#define CUDART_VERSION  11080\n\n#endif\n",
    )
    t.file(
        f"{inc}/cuda_runtime.h",
        "/* p40lab placeholder of cuda_runtime.h */\n#if !defined(__CUDA_RUNTIME_H__)\n"
        '#define __CUDA_RUNTIME_H__\n#include "cuda_runtime_api.h"\n#endif\n',
    )
    lib = f"{tk}/targets/x86_64-linux/lib"
    for real, soname in CUDA_LIBS:
        t.file(f"{lib}/{real}", shared_lib(soname, work), 0o755)
        t.link(f"{lib}/{soname}", real)
        t.link(f"{lib}/{soname.split('.so')[0]}.so", soname)
    t.link(f"{tk}/lib64", "targets/x86_64-linux/lib")
    t.link(f"{tk}/include", "targets/x86_64-linux/include")
    t.file(f"{tk}/nvvm/libdevice/libdevice.10.bc", b"p40lab placeholder\n")
    t.file(f"{tk}/doc/man/man1/nvcc.1", '.TH NVCC 1 "2022" "CUDA 11.8"\n')
    t.file(f"{tk}/EULA.txt", "p40lab placeholder of the CUDA EULA\n")
    t.file(f"{tk}/version.json", _version_json())
    t.file(
        f"builds/{driver_filename(CUDA_DRIVER)}",
        build_driver(CUDA_DRIVER, kernel_release, work),
        0o755,
    )
    nfiles = sum(1 for p in t.entries if p.startswith(f"{tk}/"))
    t.file(
        "cuda-installer",
        fill(
            doubles.source("cuda-installer.sh"),
            CUDA_VERSION=CUDA_VERSION,
            CUDA_SHORT=CUDA_SHORT,
            DRIVER_VERSION=CUDA_DRIVER,
            GCC_MAX=11,
            STEP_SLEEP=f"{2.5 / nfiles:.3f}",
        ),
        0o755,
    )
    return makeself(
        t,
        label="NVIDIA CUDA Toolkit",
        script="cuda-installer",
        targetname=f"cuda_{CUDA_VERSION}_{CUDA_DRIVER}_linux",
        req_bytes=unpack_bytes,
        req_env="P40LAB_CUDA_UNPACK_BYTES",
    )
