"""Apex stand-in for the simulated P40 lab (p40fleet).

Carries apex's build interface (setup.py flags, env knobs, the torch/nvcc version check) and
one real C++ extension, ``apex_C``. It has none of apex's CUDA kernels: ``amp_C`` and
``fused_layer_norm_cuda`` do not exist here, so CUDA-extension checks are SKIPped on simulated
hosts.
"""

__version__ = "0.1"
STANDIN = True

try:  # written by setup.py at build time
    from apex._build_info import BUILD_INFO
except ImportError:  # running from the source tree
    BUILD_INFO = {}
