#!/bin/sh
# p40lab double of nvidia-installer @VERSION@ (payload of NVIDIA-Linux-x86_64-@VERSION@.run).
# Real behaviour reproduced (docs/stack-facts.md §4):
#  * -s/--silent implies --ui=none --no-questions; DKMS registration is on by default since R520
#    (--no-dkms turns it off, --dkms forces it);
#  * --dkms without dkms(8) on the host skips DKMS with only a log line (525's misc.c: "If
#    dkms(8) or tar(1) are missing, there is nothing to do here"): the module is then installed
#    for the running kernel only; with dkms it runs `dkms add/build/install` and fails when they
#    do ("Failed to install the kernel module through DKMS ...");
#  * needs a compiler (cc) and make, and the headers of the *running* kernel at
#    /lib/modules/$(uname -r)/build ("Unable to find the kernel source tree ...");
#  * aborts while nouveau is loaded (/sys/module/nouveau), --disable-nouveau only writes
#    /etc/modprobe.d/nvidia-installer-disable-nouveau.conf and still fails;
#  * an already installed driver of another version is uninstalled first;
#  * log /var/log/nvidia-installer.log (rewritten each run), errors "ERROR: ..." on stdout, exit 1.
# Nothing is compiled: the kernel modules are prebuilt ELF objects with a real .modinfo section
# (`modinfo -F version nvidia` works after depmod). The module is NOT loaded by the install:
# the lab's boot hook loads it on the next boot (so nvidia-smi fails until the reboot).
VERSION="@VERSION@"
SYSROOT="${P40LAB_SYSROOT:-}"
LOG=/var/log/nvidia-installer.log
HERE=$(pwd)
PROG=$(basename "$0")
RUNFILE="${P40LAB_RUNFILE:-./nvidia-installer}"

silent=0; ui=""; noq=0; dkms=1; mode=install; disable_nouveau=0; kernel_source=""; kname=""
argv="$*"
for a in "$@"; do
    case "$a" in
        -s|--silent) silent=1; ui=none; noq=1 ;;
        --ui=*) ui="${a#--ui=}" ;;
        -q|--no-questions) noq=1 ;;
        --dkms) dkms=1 ;;
        --no-dkms) dkms=0 ;;
        --uninstall) mode=uninstall ;;
        -v|--version) mode=version ;;
        -h|--help|-A|--advanced-options) mode=help ;;
        --disable-nouveau) disable_nouveau=1 ;;
        --kernel-source-path=*) kernel_source="${a#--kernel-source-path=}" ;;
        -k=*|--kernel-name=*) kname="${a#*=}" ;;
        --tmpdir=*|--target|--keep|--check|--nox11|--nodiskspace) ;;
        -a|--accept-license|-N|--no-network|-X|--run-nvidia-xconfig|--no-x-check|\
        --no-nouveau-check|--no-cc-version-check|--no-opengl-files|--no-install-libglvnd|\
        --install-libglvnd|--no-drm|--no-peermem|--install-compat32-libs|\
        --no-install-compat32-libs|--no-kernel-module-source|--no-backup|\
        --no-distro-scripts|--no-rpms|--no-systemd|--systemd|--skip-module-unload|\
        --no-precompiled-interface|--no-abi-note|--force-libglx-indirect|--compat32-libdir=*|\
        --x-prefix=*|--opengl-prefix=*|--utility-prefix=*|--documentation-prefix=*|\
        --kernel-install-path=*|--log-file-name=*|--concurrency-level=*|--no-check-for-alternate-installs|\
        --no-unified-memory|--install-libglvnd|-z|--no-install-vdpau-wrapper) ;;
        *)
            echo "nvidia-installer: unrecognized option: \"$a\""
            echo
            echo "ERROR: Invalid commandline, please run \`$PROG --help\` for usage information."
            echo
            exit 1 ;;
    esac
done
[ "$PROG" = nvidia-uninstall ] && mode=uninstall

kr=${kname:-$(uname -r)}
moddir="/lib/modules/$kr"

log() { echo "$*" >> "$LOG"; }
say() { echo "$*"; log "$*"; }
fail() {
    say "ERROR: $*"
    say ""
    say "ERROR: Installation has failed.  Please see the file '$LOG' for details.  You may find suggestions on fixing installation problems in the README available on the Linux driver download page at www.nvidia.com."
    exit 1
}

installed_version() {
    [ -f /var/lib/nvidia/log ] || return 1
    sed -n 's/^VERSION //p' /var/lib/nvidia/log | head -n1
}

do_uninstall() {   # $1 = version being removed
    old="$1"
    while IFS= read -r line; do
        case "$line" in
            "FILE "*) rm -f "${line#FILE }" ;;
            "DIR "*) rm -rf "${line#DIR }" ;;
        esac
    done < /var/lib/nvidia/log
    if command -v dkms >/dev/null 2>&1 && [ -d "/var/lib/dkms/nvidia/$old" ]; then
        dkms remove -m nvidia -v "$old" --all >> "$LOG" 2>&1
    fi
    rm -rf "/var/lib/dkms/nvidia/$old" "/usr/src/nvidia-$old"
    rmdir /var/lib/dkms/nvidia 2>/dev/null
    rm -f /var/lib/p40lab-sim/nvidia-module-version /var/lib/nvidia/log
    command -v depmod >/dev/null 2>&1 && depmod -a "$kr" >> "$LOG" 2>&1
    return 0
}

case "$mode" in
    version)
        echo ""
        echo "nvidia-installer:  version $VERSION"
        echo "  The NVIDIA Software Installer for Unix/Linux."
        echo ""
        echo "  This program is used to install, upgrade and uninstall The NVIDIA"
        echo "  Accelerated Graphics Driver Set for Linux-x86_64."
        echo ""
        echo "  Copyright (C) 2003 - 2010 NVIDIA Corporation."
        echo ""
        exit 0 ;;
    help)
        echo ""
        echo "nvidia-installer [options]"
        echo ""
        echo "  -v, --version           Print the nvidia-installer version and exit."
        echo "  -h, --help              Print usage information for the common commandline options and exit."
        echo "  -s, --silent            Run silently; no questions are asked and no output is printed,"
        echo "                          except for error messages to stderr.  This option implies"
        echo "                          '--ui=none --no-questions --accept-license'."
        echo "  --uninstall             Uninstall the currently installed NVIDIA driver."
        echo "  --dkms, --no-dkms       Register (default) / do not register the kernel module with DKMS."
        echo "  --disable-nouveau       Write a modprobe configuration file that disables Nouveau."
        echo ""
        exit 0 ;;
esac

mkdir -p /var/log /var/lib/nvidia /var/lib/p40lab-sim
{
    echo "nvidia-installer log file '$LOG'"
    echo "creation time: $(date)"
    echo "installer version: $VERSION"
    echo ""
    echo "PATH: $PATH"
    echo ""
    echo "nvidia-installer command line:"
    echo "    ./nvidia-installer"
    for a in $argv; do echo "    $a"; done
    echo ""
} > "$LOG"

if [ "$(id -u)" != 0 ]; then
    fail "nvidia-installer must be run as root"
fi

if [ "$ui" != none ] && [ ! -t 0 ]; then
    log "Unable to load: nvidia-installer ncurses v6 user interface"
    say "ERROR: Unable to initialize the ncurses user interface: standard input is not a terminal; questions cannot be answered. Run the installer with --silent (or --ui=none --no-questions) for an unattended installation."
    exit 1
fi
[ "$silent" = 1 ] || log "Using: nvidia-installer ncurses v6 user interface"
[ "$silent" = 1 ] && log "Using built-in stream user interface"
log "-> Detected $(nproc 2>/dev/null || echo 1) CPUs online; setting concurrency level to $(nproc 2>/dev/null || echo 1)."

if [ "$mode" = uninstall ]; then
    old=$(installed_version) || old=""
    if [ -z "$old" ]; then
        say "ERROR: No NVIDIA driver is currently installed; nothing to uninstall."
        exit 1
    fi
    log "-> Uninstalling NVIDIA Accelerated Graphics Driver for Linux-x86_64 ($old):"
    do_uninstall "$old"
    say "-> Uninstallation of existing driver: NVIDIA Accelerated Graphics Driver for Linux-x86_64 ($old) is complete."
    exit 0
fi

log "-> Installing NVIDIA driver version $VERSION."
old=$(installed_version) || old=""
if [ -n "$old" ] && [ "$old" != "$VERSION" ]; then
    log "-> There appears to already be a driver installed on your system (version: $old).  As part of installing this driver (version: $VERSION), the existing driver will be uninstalled.  Are you sure you want to continue? (Answer: Continue installation)"
fi

# compiler + make (nvidia-installer: "Unable to find the system utility `cc`; ...")
for util in cc make ld; do
    if ! command -v "$util" >/dev/null 2>&1; then
        case "$util" in cc) pkg=cc ;; make) pkg=make ;; ld) pkg=binutils ;; esac
        fail "Unable to find the system utility \`$util\`; please make sure you have the package '$pkg' installed.  If you do have $pkg installed, then please check that \`$util\` is in your PATH."
    fi
done
log "-> Performing CC sanity check with CC=\"$(command -v cc)\"."
log "-> Performing CC check."

src="${kernel_source:-$moddir/build}"
if [ ! -d "$src" ] || [ ! -f "$src/Makefile" ]; then
    fail "Unable to find the kernel source tree for the currently running kernel.  Please make sure you have installed the kernel source files for your kernel and that they are properly configured; on Red Hat Linux systems, for example, be sure you have the 'kernel-source' or 'kernel-devel' RPM installed.  If you know the correct kernel source files are installed, you may specify the kernel source path with the '--kernel-source-path' command line option."
fi
log "-> Kernel source path: '$src'"
log "-> Kernel output path: '$src'"

if [ -e "$SYSROOT/sys/module/nouveau" ]; then
    if [ "$disable_nouveau" = 1 ]; then
        mkdir -p /etc/modprobe.d
        printf '# generated by nvidia-installer\nblacklist nouveau\noptions nouveau modeset=0\n' \
            > /etc/modprobe.d/nvidia-installer-disable-nouveau.conf
        log "-> One or more modprobe configuration files to disable Nouveau have been written.  For some distributions, this may be sufficient to disable Nouveau; other distributions may require modification of the initial ramdisk.  Please reboot your system and attempt NVIDIA driver installation again.  Note if you later wish to re-enable Nouveau, you will need to delete these files: /etc/modprobe.d/nvidia-installer-disable-nouveau.conf"
    else
        log "-> For some distributions, Nouveau can be disabled by adding a file in the modprobe configuration directory.  Would you like nvidia-installer to attempt to create this modprobe file for you? (Answer: No)"
    fi
    fail "The Nouveau kernel driver is currently in use by your system.  This driver is incompatible with the NVIDIA driver, and must be disabled before proceeding.  Please consult the NVIDIA driver README and your Linux distribution's documentation for details on how to correctly disable the Nouveau kernel driver."
fi

if [ -n "$old" ]; then
    log "-> Uninstalling the previous installation ($old) with /usr/bin/nvidia-uninstall."
    do_uninstall "$old"
    log "-> Uninstallation of existing driver: NVIDIA Accelerated Graphics Driver for Linux-x86_64 ($old) is complete."
fi

if [ "$dkms" = 1 ] && ! command -v dkms >/dev/null 2>&1; then
    log "WARNING: Failed to run \`dkms\`: command not found.  The kernel module will not be registered with DKMS."
    dkms=0
fi

log "-> Kernel module compilation complete."
manifest=/var/lib/nvidia/log
echo "VERSION $VERSION" > "$manifest"
inst() {   # src dest mode
    mkdir -p "$(dirname "$2")"
    cp "$1" "$2" && chmod "$3" "$2"
    echo "FILE $2" >> "$manifest"
}
if [ "$dkms" = 1 ]; then
    # as nvidia-installer does: the module source goes to /usr/src, then dkms add/build/install
    log "-> Installing DKMS kernel module:"
    mkdir -p "/usr/src/nvidia-$VERSION"
    cp kernel/*.ko "/usr/src/nvidia-$VERSION/"
    printf 'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="%s"\nAUTOINSTALL="yes"\nBUILT_MODULE_NAME[0]="nvidia"\nDEST_MODULE_LOCATION[0]="/kernel/drivers/video"\n' \
        "$VERSION" > "/usr/src/nvidia-$VERSION/dkms.conf"
    for step in add build install; do
        log "   Executing: dkms $step -m nvidia -v $VERSION -k $kr"
        if ! dkms "$step" -m nvidia -v "$VERSION" -k "$kr" >> "$LOG" 2>&1; then
            dkms remove -m nvidia -v "$VERSION" --all >> "$LOG" 2>&1
            rm -rf "/usr/src/nvidia-$VERSION"
            fail "Failed to install the kernel module through DKMS. No kernel module was installed; please try installing again without DKMS, or check the DKMS logs for more information."
        fi
    done
    log "   done."
else
    for ko in kernel/*.ko; do inst "$ko" "$moddir/kernel/drivers/video/$(basename "$ko")" 644; done
fi
inst nvidia-smi /usr/bin/nvidia-smi 755
inst libnvidia-ml.so.$VERSION /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.$VERSION 755
ln -sf "libnvidia-ml.so.$VERSION" /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
echo "FILE /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" >> "$manifest"
inst nvidia-installer /usr/bin/nvidia-installer 755
ln -sf nvidia-installer /usr/bin/nvidia-uninstall
echo "FILE /usr/bin/nvidia-uninstall" >> "$manifest"
echo "$VERSION" > /var/lib/p40lab-sim/nvidia-module-version
command -v ldconfig >/dev/null 2>&1 && ldconfig 2>/dev/null
if command -v depmod >/dev/null 2>&1; then
    log "-> Running depmod."
    depmod -a "$kr" >> "$LOG" 2>&1
fi
log "-> Installation of the kernel module for the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version $VERSION) is now complete."
log "-> Installation of the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: $VERSION) is now complete."
[ "$silent" = 1 ] || echo "Installation of the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: $VERSION) is now complete."
exit 0
