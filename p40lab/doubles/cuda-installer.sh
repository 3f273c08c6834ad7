#!/bin/sh
# p40lab double of cuda-installer (payload of cuda_@CUDA_VERSION@_@DRIVER_VERSION@_linux.run).
# Real behaviour reproduced (docs/stack-facts.md §4):
#  * the interactive (ncurses) installer needs a terminal: without --silent it refuses here;
#  * --silent with no component installs everything (driver + toolkit); --toolkit / --driver pick;
#  * gcc newer than @GCC_MAX@ fails "Failed to verify gcc version" unless --override;
#  * --installpath=DIR (alias --toolkitpath=DIR), default /usr/local/cuda-@CUDA_SHORT@ (then it also
#    points /usr/local/cuda at it); --tmpdir is handled by the makeself header (free space check);
#  * --driver runs the bundled driver @DRIVER_VERSION@ installer silently (it never asks);
#  * log /var/log/cuda-installer.log (appended), exit 0 on success, 1 on failure.
# Files are copied one by one (small sleeps, ~2.5 s in all) with version.json last, so a run that
# is killed midway leaves a partial tree without version.json.
CUDA_VERSION="@CUDA_VERSION@"
CUDA_SHORT="@CUDA_SHORT@"
DRIVER_VERSION="@DRIVER_VERSION@"
GCC_MAX=@GCC_MAX@
LOG=/var/log/cuda-installer.log
STEP_SLEEP="${P40LAB_CUDA_STEP_SLEEP:-@STEP_SLEEP@}"

silent=0; toolkit=0; driver=0; override=0; installpath=""; manpage=1
for a in "$@"; do
    case "$a" in
        --silent) silent=1 ;;
        --toolkit) toolkit=1 ;;
        --driver) driver=1 ;;
        --override) override=1 ;;
        --installpath=*) installpath="${a#--installpath=}" ;;
        --toolkitpath=*) installpath="${a#--toolkitpath=}" ;;
        --no-man-page) manpage=0 ;;
        --tmpdir=*|--no-opengl-libs|--no-drm|--run-nvidia-xconfig|--samples|--kernelobjs|\
        --defaultroot=*|--librarypath=*|-m=*|--nox11|--keep|--nodiskspace|--override-driver-check|\
        --no-driver-compat|--no-symlink) ;;
        --help|-h)
            echo "Options:"
            echo "  --silent             Perform an installation with no further user-input and minimal"
            echo "                       command-line output (implies acceptance of the EULA)."
            echo "  --driver             Install the CUDA Driver."
            echo "  --toolkit            Install the CUDA Toolkit."
            echo "  --installpath=<path> Install everything into <path>."
            echo "  --override           Ignore compiler, third-party library, and toolkit detection checks."
            echo "  --tmpdir=<path>      Perform any temporary actions within <path> instead of /tmp."
            echo "  --no-man-page        Do not install the man pages under /usr/share/man."
            exit 0 ;;
        *)
            echo "Unknown option: $a"
            echo "Use --help for a list of options."
            exit 1 ;;
    esac
done
stamp() { date '+%Y-%m-%d %H:%M:%S'; }
log() { echo "[$(stamp)] [$1]: $2" >> "$LOG"; }
mkdir -p /var/log
log INFO "Driver not installed."
log INFO "Checking compiler version..."

if [ "$silent" = 0 ]; then
    log ERROR "Interactive installation requires a terminal; none available."
    if [ -t 0 ] && [ -t 1 ]; then
        echo "The interactive (ncurses) installer is not available in this environment; re-run with --silent (see --help)."
    else
        echo "Error opening terminal: unknown."
    fi
    exit 1
fi
[ "$toolkit" = 0 ] && [ "$driver" = 0 ] && { toolkit=1; driver=1; }

if [ "$override" = 0 ]; then
    ver=""
    if command -v gcc >/dev/null 2>&1; then
        ver=$(gcc --version 2>/dev/null | head -n1 | awk '{print $NF}')
        log INFO "gcc location: $(command -v gcc)"
        log INFO "gcc version: $(gcc --version 2>/dev/null | head -n1)"
    else
        log ERROR "Missing gcc. gcc is required to continue."
    fi
    major=${ver%%.*}
    case "$major" in ''|*[!0-9]*) major=999 ;; esac
    if [ -z "$ver" ] || [ "$major" -gt "$GCC_MAX" ]; then
        [ -n "$ver" ] && log ERROR "unsupported compiler version: $ver. Use --override to override this check."
        echo "Failed to verify gcc version. See log at $LOG for details."
        exit 1
    fi
else
    log WARNING "Compiler version check overridden (--override)."
fi

if [ "$driver" = 1 ]; then
    log INFO "Installing: Driver"
    if ! sh "builds/NVIDIA-Linux-x86_64-$DRIVER_VERSION.run" --silent --no-drm >> "$LOG" 2>&1; then
        log ERROR "Install of driver component failed. Consult the driver log at /var/log/nvidia-installer.log for more details."
        echo "Failed to install driver component. See log at $LOG for details."
        exit 1
    fi
    log INFO "Finished with code: 0"
fi

if [ "$toolkit" = 1 ]; then
    dest="${installpath:-/usr/local/cuda-$CUDA_SHORT}"
    log INFO "Installing: CUDA Toolkit $CUDA_SHORT into $dest"
    if ! mkdir -p "$dest" 2>/dev/null || [ ! -w "$dest" ]; then
        log ERROR "Cannot create installation directory $dest"
        echo "Failed to create the installation directory $dest. See log at $LOG for details."
        exit 1
    fi
    (cd toolkit && find . -mindepth 1 \( -type f -o -type l \) ! -name version.json | LC_ALL=C sort) > .filelist
    echo ./version.json >> .filelist
    while IFS= read -r f; do
        f=${f#./}
        mkdir -p "$dest/$(dirname "$f")"
        rm -f "$dest/$f" 2>/dev/null
        if ! cp -P "toolkit/$f" "$dest/$f"; then
            log ERROR "Failed to copy $f"
            echo "Failed to install the CUDA Toolkit. See log at $LOG for details."
            exit 1
        fi
        log INFO "Installed: $dest/$f"
        sleep "$STEP_SLEEP"
    done < .filelist
    if [ -z "$installpath" ] || [ "$installpath" = "/usr/local/cuda-$CUDA_SHORT" ]; then
        ln -sfn "/usr/local/cuda-$CUDA_SHORT" /usr/local/cuda
        log INFO "Symlinked /usr/local/cuda -> /usr/local/cuda-$CUDA_SHORT"
    fi
    if [ "$manpage" = 1 ]; then
        mkdir -p /usr/share/man/man1 && cp toolkit/doc/man/man1/nvcc.1 /usr/share/man/man1/ 2>/dev/null
    fi
    log INFO "Finished with code: 0"
fi
log INFO "Cleaning up"
exit 0
