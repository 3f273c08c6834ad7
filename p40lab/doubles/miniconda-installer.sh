#!/bin/sh
# p40lab double of the Miniconda3 @MC_VERSION@ installer (Linux-x86_64).
# Real options: -b (batch, accept licence), -f (no error if PREFIX exists), -h, -p PREFIX
# (default $HOME/miniconda3), -s, -u (update an existing installation), -t.
# Without -b it shows the licence and asks; with no terminal it cannot (refused here).
# PREFIX is a REAL venv of the host's python3 (the "base env"); PREFIX/bin/conda is the conda
# double (envs = venvs of the host python). Payload: a gzip'd tar starting at line SKIP.
NAME="Miniconda3"
VER="@MC_VERSION@"
CONDA_VERSION="@CONDA_VERSION@"
SKIP=@SKIP@
THIS_PATH="$0"
BATCH=0; FORCE=0; UPDATE=0; PREFIX="${HOME:-/root}/miniconda3"
usage() {
    printf "usage: %s [options]\n\nInstalls %s %s\n\n" "$0" "$NAME" "$VER"
    printf -- "-b           run install in batch mode (without manual intervention),\n"
    printf -- "             it is expected the license terms (if any) are agreed upon\n"
    printf -- "-f           no error if install prefix already exists\n"
    printf -- "-h           print this help message and exit\n"
    printf -- "-p PREFIX    install prefix, defaults to %s, must not contain spaces.\n" "$PREFIX"
    printf -- "-s           skip running pre/post-link/install scripts\n"
    printf -- "-u           update an existing installation\n"
    printf -- "-t           run package tests after installation (may install conda-build)\n"
}
while getopts "bifhkp:sut" x; do
    case "$x" in
        h) usage; exit 2 ;;
        b) BATCH=1 ;;
        i|k|s|t) ;;
        f) FORCE=1 ;;
        p) PREFIX="$OPTARG" ;;
        u) UPDATE=1; FORCE=1 ;;
        ?) printf "ERROR: did not recognize option '%s', please try -h\n" "$x"; exit 1 ;;
    esac
done
if [ "$BATCH" = 0 ]; then
    printf "\nWelcome to %s %s\n\n" "$NAME" "$VER"
    printf "In order to continue the installation process, please review the license\n"
    printf "agreement.\n"
    printf "Please, press ENTER to continue\n>>> "
    if [ ! -t 0 ]; then
        printf "\nPlease answer 'yes' or 'no':'\n>>> \n"
        echo "ERROR: the license agreement cannot be accepted without a terminal; use -b for a batch install." >&2
        exit 1
    fi
    read -r dummy
    printf "Do you accept the license terms? [yes|no]\n>>> "
    read -r ans
    case "$ans" in [yY]|[yY][eE][sS]) ;; *) printf "The license agreement wasn't approved, aborting installation.\n"; exit 2 ;; esac
fi
case "$PREFIX" in *" "*) printf "ERROR: Cannot install into directories with spaces\n" >&2; exit 1 ;; esac
if [ "$FORCE" = 0 ] && [ -e "$PREFIX" ]; then
    printf "ERROR: File or directory already exists: '%s'\n" "$PREFIX" >&2
    printf "If you want to update an existing installation, use the -u option.\n" >&2
    exit 1
elif [ "$UPDATE" = 1 ] && [ -e "$PREFIX" ]; then
    echo "Updating existing installation"
fi
if ! mkdir -p "$PREFIX" 2>/dev/null; then
    printf "ERROR: Could not create directory: '%s'\n" "$PREFIX" >&2
    exit 1
fi
PREFIX=$(cd "$PREFIX" && pwd)
echo "PREFIX=$PREFIX"
echo "Unpacking payload ..."
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    echo "ERROR: p40lab Miniconda double: the host needs python3 with venv/ensurepip (python3-venv)" >&2
    exit 1
fi
tmp=$(mktemp -d) || exit 1
tail -n +"$SKIP" "$THIS_PATH" | gzip -dc | (cd "$tmp" && tar xf -) || { echo "ERROR: could not extract tarball" >&2; rm -rf "$tmp"; exit 1; }
echo ""
echo "Installing base environment..."
echo ""
printf "Preparing transaction: ...working... "
if ! /usr/bin/python3 -m venv "$PREFIX" > "$tmp/venv.log" 2>&1; then
    echo "failed"; cat "$tmp/venv.log" >&2; rm -rf "$tmp"; exit 1
fi
echo "done"
printf "Executing transaction: ...working... "
HOST_PY=$(/usr/bin/python3 -c 'import platform; print(platform.python_version())')
mkdir -p "$PREFIX/bin" "$PREFIX/condabin" "$PREFIX/conda-meta" "$PREFIX/etc/profile.d" "$PREFIX/envs" "$PREFIX/pkgs"
{ echo "#!$PREFIX/bin/python"; sed -e "s/@HOST_PYTHON@/$HOST_PY/" "$tmp/conda.py"; } > "$PREFIX/bin/conda"
chmod 755 "$PREFIX/bin/conda"
ln -sf ../bin/conda "$PREFIX/condabin/conda"
sed -e "s#@PREFIX@#$PREFIX#g" "$tmp/conda.sh" > "$PREFIX/etc/profile.d/conda.sh"
printf "==> %s <==\n# cmd: %s\n+python-%s\n+conda-%s\n" "$(date '+%Y-%m-%d %H:%M:%S')" "$THIS_PATH $*" "$HOST_PY" "$CONDA_VERSION" >> "$PREFIX/conda-meta/history"
echo "$VER" > "$PREFIX/conda-meta/.p40lab-miniconda"
rm -rf "$tmp"
echo "done"
echo "installation finished."
exit 0
