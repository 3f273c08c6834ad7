# p40lab double of PREFIX/etc/profile.d/conda.sh: `conda activate NAME` / `conda deactivate`
export CONDA_EXE='@PREFIX@/bin/conda'
export _CONDA_ROOT='@PREFIX@'
conda() {
    case "${1:-}" in
        activate)
            _p='@PREFIX@'
            if [ -n "${2:-}" ] && [ "$2" != base ]; then
                case "$2" in */*) _p="$2" ;; *) _p='@PREFIX@/envs/'"$2" ;; esac
            fi
            if [ ! -d "$_p/conda-meta" ]; then
                echo "EnvironmentNameNotFound: Could not find conda environment: ${2:-base}" >&2
                return 1
            fi
            [ -n "${CONDA_PREFIX:-}" ] && PATH=$(echo "$PATH" | sed -e "s#$CONDA_PREFIX/bin:##")
            export PATH="$_p/bin:$PATH" CONDA_PREFIX="$_p" CONDA_DEFAULT_ENV="${2:-base}" CONDA_SHLVL=1
            ;;
        deactivate)
            [ -n "${CONDA_PREFIX:-}" ] && PATH=$(echo "$PATH" | sed -e "s#$CONDA_PREFIX/bin:##")
            export PATH; unset CONDA_PREFIX CONDA_DEFAULT_ENV; CONDA_SHLVL=0
            ;;
        *) "$CONDA_EXE" "$@" ;;
    esac
}
