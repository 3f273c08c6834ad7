"""The cuDNN archive double (a real ``.tar.xz``, deterministic)."""

from __future__ import annotations

from pathlib import Path

from p40lab.artifacts.archive import Tree
from p40lab.artifacts.elf import shared_lib
from p40lab.artifacts.pins import CUDNN_TOP, CUDNN_VERSION

CUDNN_SUBLIBS = ("adv_infer", "adv_train", "cnn_infer", "cnn_train", "ops_infer", "ops_train")


def cudnn_version_h(major: int = 8, minor: int = 9, patch: int = 7) -> str:
    return (
        "/* p40lab placeholder of cudnn_version.h (the real file starts with NVIDIA's licence\n"
        " * notice; the defines below have the real names and layout) */\n\n"
        "/**\n * \\file: The master cuDNN version file.\n */\n\n"
        "#ifndef CUDNN_VERSION_H_\n#define CUDNN_VERSION_H_\n\n"
        f"#define CUDNN_MAJOR {major}\n#define CUDNN_MINOR {minor}\n"
        f"#define CUDNN_PATCHLEVEL {patch}\n\n"
        "#define CUDNN_VERSION (CUDNN_MAJOR * 1000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL)\n\n"
        "/* cannot use constexpr here since this is a C-only file */\n"
        "/* Below is the max SM version this cuDNN library is aware of and supports natively */\n\n"
        "#define CUDNN_MAX_SM_MAJOR_NUMBER 9\n#define CUDNN_MAX_SM_MINOR_NUMBER 0\n"
        "#define CUDNN_MAX_DEVICE_VERSION (CUDNN_MAX_SM_MAJOR_NUMBER * 100) + "
        "(CUDNN_MAX_SM_MINOR_NUMBER * 10)\n\n#endif /* CUDNN_VERSION_H */\n"
    )


def build_cudnn(work: Path) -> bytes:
    t = Tree()
    major, minor, patch = (int(x) for x in CUDNN_VERSION.split(".")[:3])
    full = f"{major}.{minor}.{patch}"
    hdrs = ["cudnn_backend"] + [f"cudnn_{s}" for s in CUDNN_SUBLIBS]
    body = "".join(f'#include "{h}.h"\n' for h in hdrs if h != "cudnn_backend")
    t.file(
        "include/cudnn.h",
        "/* p40lab placeholder of cudnn.h */\n\n#if !defined(CUDNN_H_)\n#define CUDNN_H_\n\n"
        '#include <cuda_runtime.h>\n#include <stdint.h>\n\n#include "cudnn_version.h"\n'
        + body
        + "\n#endif /* CUDNN_H_ */\n",
    )
    t.file("include/cudnn_version.h", cudnn_version_h(major, minor, patch))
    for h in hdrs:
        guard = h.upper() + "_H_"
        t.file(
            f"include/{h}.h",
            f"/* p40lab placeholder of {h}.h (cuDNN {full}) */\n#if !defined({guard})\n"
            f'#define {guard}\n#include "cudnn_version.h"\n#endif\n',
        )
    for h in ["cudnn", "cudnn_version"] + hdrs:
        t.file(
            f"include/{h}_v{major}.h",
            f'/* p40lab placeholder: versioned alias */\n#include "{h}.h"\n',
        )
    for name in ["libcudnn"] + [f"libcudnn_{s}" for s in CUDNN_SUBLIBS]:
        real, soname = f"{name}.so.{full}", f"{name}.so.{major}"
        t.file(f"lib/{real}", shared_lib(soname, work), 0o755)
        t.link(f"lib/{soname}", real)
        t.link(f"lib/{name}.so", soname)
    t.file(
        "LICENSE",
        "p40lab placeholder: the real archive carries the NVIDIA cuDNN Software License "
        "Agreement here.\n",
    )
    return t.tar_bytes(top=CUDNN_TOP, compress="xz")
