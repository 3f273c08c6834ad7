#!/bin/sh
# p40lab double of nvcc (CUDA @CUDA_SHORT@): `--version`/`-V` print what the real one prints;
# nothing is compiled.
case " $* " in
    *" --version "*|*" -V "*)
        cat <<'V'
nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2022 NVIDIA Corporation
Built on Wed_Sep_21_10:33:58_PDT_2022
Cuda compilation tools, release 11.8, V11.8.89
Build cuda_11.8.r11.8/compiler.31833905_0
V
        exit 0 ;;
esac
if [ $# -eq 0 ]; then
    echo "nvcc fatal   : No input files specified; use option --help for more information" >&2
    exit 1
fi
echo "nvcc fatal   : p40lab double: compilation is not simulated" >&2
exit 1
