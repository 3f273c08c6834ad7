#!/usr/bin/env bash
# Build everything the GPU PPO run carries to the device (benchmarks/gpu_ppo/README.md).
#
#   benchmarks/gpu_ppo/prepare.sh [--with-harness]
#
# Needs PyPI and a python3.12 here (PY312=...; pyenv's is found). Writes, under build/gpu_ppo/
# (ignored by git through /build/):
#   wheels/   cp312 manylinux wheels of the trainer's set (issue 17) + pydantic for p40fleet,
#             antlr4-python3-runtime, pylatexenc and verl built here from their sdists
#   carry1/   the first RAY_PART1_MIB of ray's wheel (ray alone is over the 64 MiB a call carries)
#   carry2/   the rest of ray, the other wheels, assets/ (model config + tokenizer, parquet pair)
#             and manifest.json (ray's sha256 and parts); --with-harness adds a copy of this
#             folder's scripts (for a checkout that does not have them yet)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=build/gpu_ppo
RAY_PART1_MIB=${RAY_PART1_MIB:-56}
if [ -z "${PY312:-}" ]; then
    for py in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12; do
        if "$py" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            PY312=$py
            break
        fi
    done
fi
[ -n "${PY312:-}" ] || { echo "prepare: no python3.12 here (set PY312=/path/to/it)" >&2; exit 2; }

# The trainer's set, as issue 17 lists it (shown to import with the device's torch 2.11), and
# what p40fleet.spec needs on the device (pydantic; kept off the trainer's path by run_ppo.py).
BINARY=(
    ray==2.48.0 tensordict==0.9.1 transformers==4.53.3 tokenizers==0.21.4
    huggingface_hub==0.36.2 codetiming==1.4.0 torchdata==0.11.0 hydra-core==1.3.2
    omegaconf==2.3.0 pyvers==0.2.3 orjson==3.13.0 jsonschema==4.26.0
    jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 datasets==3.6.0
    dill==0.3.8 multiprocess==0.70.16 importlib_metadata==10.2.0
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
)
SDIST=(antlr4-python3-runtime==4.9.3 pylatexenc==2.10 verl==0.5.0)

mkdir -p "$OUT/wheels"
"$PY312" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$OUT/wheels" "${BINARY[@]}"
for req in "${SDIST[@]}"; do
    name=${req%%==*}
    ls "$OUT/wheels/${name//-/_}"-*.whl >/dev/null 2>&1 ||
        "$PY312" -m pip wheel -q --no-deps --no-binary=:all: -w "$OUT/wheels" "$req"
done

# One version per package: two would stop the device's install.
dups=$(ls "$OUT/wheels" | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
[ -z "$dups" ] || { echo "prepare: more than one wheel of: $dups" >&2; exit 2; }

# The parquet pair needs pyarrow: a build venv of its own.
VENV=$OUT/venv
[ -x "$VENV/bin/python" ] || "$PY312" -m venv "$VENV"
"$VENV/bin/python" -c 'import pyarrow' 2>/dev/null || "$VENV/bin/pip" install -q pyarrow

rm -rf "$OUT/carry1" "$OUT/carry2"
mkdir -p "$OUT/carry1" "$OUT/carry2/wheels"
"$VENV/bin/python" benchmarks/gpu_ppo/assets.py "$OUT/carry2/assets"

ray=$(cd "$OUT/wheels" && ls ray-*.whl)
head -c $((RAY_PART1_MIB * 1024 * 1024)) "$OUT/wheels/$ray" >"$OUT/carry1/$ray.part1"
tail -c +$((RAY_PART1_MIB * 1024 * 1024 + 1)) "$OUT/wheels/$ray" >"$OUT/carry2/$ray.part2"
cmp <(cat "$OUT/carry1/$ray.part1" "$OUT/carry2/$ray.part2") "$OUT/wheels/$ray"
find "$OUT/wheels" -name '*.whl' ! -name "$ray" -exec cp {} "$OUT/carry2/wheels/" \;
sha=$(sha256sum "$OUT/wheels/$ray" | cut -d' ' -f1)
printf '{"split": {"wheel": "%s", "sha256": "%s", "parts": ["%s.part1", "%s.part2"]}}\n' \
    "$ray" "$sha" "$ray" "$ray" >"$OUT/carry2/manifest.json"

if [ "${1:-}" = "--with-harness" ]; then
    mkdir -p "$OUT/carry2/harness"
    cp -r benchmarks/gpu_ppo/*.py benchmarks/gpu_ppo/hook "$OUT/carry2/harness/"
fi
du -sh "$OUT/carry1" "$OUT/carry2"
