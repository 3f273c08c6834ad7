#!/usr/bin/env python3
# ruff: noqa: E501  (the wide nvidia-smi table rows are literal)
"""p40lab double of nvidia-smi (NVML library @VERSION@), installed by the driver double.

Reads the host's fake PCI tree ($P40LAB_SYSROOT/sys/bus/pci/devices/*, default root "/") and the
"loaded" module ($P40LAB_SYSROOT/sys/module/nvidia/version, written by the lab's boot hook).
Real behaviours reproduced:
  * module not loaded -> "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA
    driver. ..." exit 9;
  * loaded module version != this library's version -> "Failed to initialize NVML:
    Driver/library version mismatch" exit 18 (R535+ also print "NVML library version: X.Y");
  * GPUs the driver branch does not support are not bound; none left -> "No devices were found"
    exit 6;
  * default table in the <= R525 layout (narrow, 79 columns) or the R530+ wide layout;
  * --query-gpu=FIELDS --format=csv[,noheader][,nounits]; unknown field ->
    'Field "X" is not a valid field to query.' exit 2; -L; -i/--id.
Temperatures/power/utilisation are plausible idle constants.
"""

import hashlib
import os
import sys
import time

VERSION = "@VERSION@"
SYSROOT = os.environ.get("P40LAB_SYSROOT", "/")

# pci device id -> (name, memory MiB, compute capability, power cap W, min branch, max branch)
GPUS = {
    0x102D: ("Tesla K80", 11441, "3.7", 149, 340, 470),
    0x13F2: ("Tesla M60", 8192, "5.2", 150, 346, 999),
    0x17FD: ("Tesla M40 24GB", 24576, "5.2", 250, 352, 999),
    0x15F7: ("Tesla P100-PCIE-12GB", 12288, "6.0", 250, 375, 999),
    0x15F8: ("Tesla P100-PCIE-16GB", 16384, "6.0", 250, 375, 999),
    0x15F9: ("Tesla P100-SXM2-16GB", 16384, "6.0", 300, 375, 999),
    0x1B38: ("Tesla P40", 24576, "6.1", 250, 375, 999),
    0x1BB3: ("Tesla P4", 7680, "6.1", 75, 375, 999),
    0x1DB1: ("Tesla V100-SXM2-16GB", 16384, "7.0", 300, 384, 999),
    0x1DB4: ("Tesla V100-PCIE-16GB", 16384, "7.0", 250, 384, 999),
    0x1DB5: ("Tesla V100-SXM2-32GB", 32768, "7.0", 300, 384, 999),
    0x1DF6: ("Tesla V100S-PCIE-32GB", 32768, "7.0", 250, 418, 999),
    0x1EB8: ("Tesla T4", 15360, "7.5", 70, 410, 999),
    0x20B0: ("NVIDIA A100-SXM4-40GB", 40960, "8.0", 400, 450, 999),
    0x20B2: ("NVIDIA A100-SXM4-80GB", 81920, "8.0", 400, 450, 999),
    0x20B7: ("NVIDIA A30", 24576, "8.0", 165, 450, 999),
    0x20F1: ("NVIDIA A100-PCIE-40GB", 40960, "8.0", 250, 450, 999),
    0x2204: ("NVIDIA GeForce RTX 3090", 24576, "8.6", 350, 455, 999),
    0x2330: ("NVIDIA H100 80GB HBM3", 81559, "9.0", 700, 525, 999),
    0x2331: ("NVIDIA H100 PCIe", 81559, "9.0", 350, 525, 999),
    0x2335: ("NVIDIA H200", 143771, "9.0", 700, 550, 999),
}
# driver branch -> highest CUDA version it supports (the table header's "CUDA Version")
CUDA_FOR_BRANCH = {
    470: "11.4", 510: "11.6", 515: "11.7", 520: "11.8", 525: "12.0", 530: "12.1",
    535: "12.2", 545: "12.3", 550: "12.4", 555: "12.5", 560: "12.6", 565: "12.7",
    570: "12.8", 575: "12.9", 580: "13.0",
}  # fmt: skip
FIELDS = (
    "index", "name", "pci.bus_id", "pci.device_id", "compute_cap", "memory.total",
    "driver_version", "uuid", "count", "memory.used", "memory.free", "pci.sub_device_id",
    "serial", "persistence_mode", "power.limit", "temperature.gpu", "utilization.gpu",
)  # fmt: skip
ALIASES = {"gpu_name": "name", "gpu_bus_id": "pci.bus_id", "gpu_uuid": "uuid"}
UNITS = {"memory.total": " MiB", "memory.used": " MiB", "memory.free": " MiB",
         "power.limit": " W", "utilization.gpu": " %"}  # fmt: skip
BRANCH = int(VERSION.split(".")[0])
NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def gpus():
    base = os.path.join(SYSROOT, "sys/bus/pci/devices")
    found = []
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        entries = []
    for bdf in entries:
        d = os.path.join(base, bdf)
        vendor, device, cls = (_read(os.path.join(d, k)) for k in ("vendor", "device", "class"))
        if vendor != "0x10de" or not cls or not cls.startswith("0x03") or not device:
            continue
        dev = int(device, 16)
        info = GPUS.get(dev, (f"NVIDIA Device {dev:04x}", 8192, "0.0", 100, 0, 999))
        name, mem, cc, cap, lo, hi = info
        if not (lo <= BRANCH <= hi):
            continue  # the driver does not bind GPUs its branch does not support
        sub = _read(os.path.join(d, "subsystem_device")) or "0x0000"
        domain, bus, slot = bdf.split(":")
        digest = hashlib.sha256(f"{os.uname().nodename}/{bdf}/{dev:04x}".encode()).hexdigest()
        uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        found.append({
            "bdf": bdf, "bus_id": f"{int(domain, 16):08X}:{bus.upper()}:{slot.upper()}",
            "device": dev, "name": name, "mem": mem, "cc": cc, "cap": cap, "uuid": uuid,
            "sub": int(sub, 16), "serial": str(int(digest[:12], 16) % 10**13).zfill(13),
        })  # fmt: skip
    for i, g in enumerate(found):
        g["index"] = i
    return found


def value(g, field, count, units):
    used = 0
    v = {
        "index": str(g["index"]), "name": g["name"], "pci.bus_id": g["bus_id"],
        "pci.device_id": f"0x{g['device']:04X}10DE", "compute_cap": g["cc"],
        "memory.total": str(g["mem"]), "memory.used": str(used),
        "memory.free": str(g["mem"] - used), "driver_version": VERSION, "uuid": g["uuid"],
        "count": str(count), "pci.sub_device_id": f"0x{g['sub']:04X}10DE",
        "serial": g["serial"], "persistence_mode": "Disabled",
        "power.limit": f"{g['cap']:.2f}", "temperature.gpu": "30", "utilization.gpu": "0",
    }[field]  # fmt: skip
    return v + UNITS.get(field, "") if units else v


def query(fields_arg, fmt, gs):
    fields = [ALIASES.get(f.strip(), f.strip()) for f in fields_arg.split(",") if f.strip()]
    for f in fields:
        if f not in FIELDS:
            sys.stdout.write(f'Field "{f}" is not a valid field to query.\n\n')
            return 2
    opts = [o.strip() for o in fmt.split(",")]
    if not opts or opts[0] != "csv" or any(o not in ("csv", "noheader", "nounits") for o in opts):
        sys.stdout.write(f'"{fmt}" is not a valid format.\n')
        return 2
    units = "nounits" not in opts
    out = []
    if "noheader" not in opts:
        hdr = []
        for f in fields:
            u = UNITS.get(f, "").strip()
            hdr.append(f"{f} [{u}]" if u and units else f)
        out.append(", ".join(hdr))
    for g in gs:
        out.append(", ".join(value(g, f, len(gs), units) for f in fields))
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


def table(gs):
    cuda = CUDA_FOR_BRANCH.get(BRANCH, "12.0")
    now = time.strftime("%a %b %d %H:%M:%S %Y")
    wide = BRANCH >= 530
    out = [f"{now}       "]
    if not wide:
        bar = "+-------------------------------+----------------------+----------------------+"
        out += [
            "+" + "-" * 77 + "+",
            f"| NVIDIA-SMI {VERSION:<10}   Driver Version: {VERSION:<10}   "
            f"CUDA Version: {cuda:<4}     |",
            "|-------------------------------+----------------------+----------------------+",
            "| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |",
            "| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |",
            "|                               |                      |               MIG M. |",
            "|===============================+======================+======================|",
        ]
        for g in gs:
            name = g["name"] if len(g["name"]) <= 18 else g["name"][:15] + "..."
            out += [
                f"|{g['index']:>4}  {name:<18}  {'Off':<3}  | {g['bus_id']} {'Off':>3} |"
                f"{'Off':>21} |",
                f"| {'N/A':>3}  {30:>3}C    {'P8':>2}  {9:>4}W / {g['cap']:>3}W |"
                f"{0:>7}MiB / {g['mem']:>5}MiB |{0:>7}%  {'Default':>11} |",
                f"|{'':31}|{'':22}|{'N/A':>21} |",
                bar,
            ]
        out += [
            " " * 79,
            "+" + "-" * 77 + "+",
            f"| Processes:{'':66}|",
            "|  GPU   GI   CI        PID   Type   Process name                  GPU Memory |",
            "|        ID   ID                                                   Usage      |",
            "|" + "=" * 77 + "|",
            f"|  {'No running processes found':<75}|",
            "+" + "-" * 77 + "+",
        ]
    else:
        bar = "+-----------------------------------------+----------------------+----------------------+"
        out += [
            "+" + "-" * 87 + "+",
            f"| NVIDIA-SMI {VERSION:<10}             Driver Version: {VERSION:<10}   "
            f"CUDA Version: {cuda:<4}     |",
            "|-----------------------------------------+----------------------+----------------------+",
            "| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |",
            "| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |",
            "|                                         |                      |               MIG M. |",
            "|=========================================+======================+======================|",
        ]
        for g in gs:
            name = g["name"] if len(g["name"]) <= 28 else g["name"][:25] + "..."
            out += [
                f"|{g['index']:>4}  {name:<28}{'Off':>6} | {g['bus_id']} {'Off':>3} |{'Off':>21} |",
                f"| {'N/A':>3}  {30:>3}C    {'P8':<2}{9:>16}W / {g['cap']:>3}W |"
                f"{0:>7}MiB / {g['mem']:>5}MiB |{0:>7}%  {'Default':>11} |",
                f"|{'':41}|{'':22}|{'N/A':>21} |",
                bar,
            ]
        out += [
            " " * 89,
            "+" + "-" * 87 + "+",
            f"| Processes:{'':76}|",
            "|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |",
            "|        ID   ID                                                             Usage      |",
            "|" + "=" * 87 + "|",
            f"|  {'No running processes found':<85}|",
            "+" + "-" * 87 + "+",
        ]
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


def main(argv):
    q = fmt = None
    ids = None
    list_gpus = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--query-gpu="):
            q = a.split("=", 1)[1]
        elif a == "--query-gpu" and i + 1 < len(argv):
            i += 1
            q = argv[i]
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a == "--format" and i + 1 < len(argv):
            i += 1
            fmt = argv[i]
        elif a.startswith("--id=") or a.startswith("-i="):
            ids = a.split("=", 1)[1]
        elif a in ("-i", "--id") and i + 1 < len(argv):
            i += 1
            ids = argv[i]
        elif a in ("-L", "--list-gpus"):
            list_gpus = True
        elif a in ("-h", "--help"):
            sys.stdout.write(f"NVIDIA System Management Interface -- v{VERSION}\n")
            return 0
        else:
            sys.stdout.write(
                "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n"
            )
            return 2
        i += 1
    if q is not None and fmt is None:
        sys.stdout.write('"--format" option must be specified when "--query-gpu" is used.\n')
        return 2

    loaded = _read(os.path.join(SYSROOT, "sys/module/nvidia/version"))
    if loaded is None and not os.path.isdir(os.path.join(SYSROOT, "sys/module/nvidia")):
        sys.stdout.write(NOT_LOADED + "\n")
        return 9
    if loaded != VERSION:
        msg = "Failed to initialize NVML: Driver/library version mismatch\n"
        if BRANCH >= 535:
            msg += "NVML library version: " + ".".join(VERSION.split(".")[:2]) + "\n"
        sys.stdout.write(msg)
        return 18
    gs = gpus()
    if ids is not None:
        want = {s.strip() for s in ids.split(",")}
        gs = [g for g in gs if str(g["index"]) in want or g["uuid"] in want or g["bus_id"] in want]
        if not gs:
            sys.stdout.write("No devices were found\n")
            return 6
    if not gs:
        sys.stdout.write("No devices were found\n")
        return 6
    if list_gpus:
        for g in gs:
            sys.stdout.write(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n")
        return 0
    if q is not None:
        return query(q, fmt, gs)
    return table(gs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
