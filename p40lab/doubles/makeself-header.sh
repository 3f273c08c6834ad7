#!/bin/sh
# p40lab double of a makeself self-extracting archive (as NVIDIA ships its .run files).
# Layout: this shell header, then a gzip'd tar payload starting at line SKIP.
# Makeself options handled: --check, --info, --list, -x/--extract-only, --target DIR, --keep,
# --tmpdir=DIR (also passed on), TMPDIR. Everything else goes to the payload's installer.
# The payload MD5 is verified before unpacking (real makeself: "Error in MD5 checksums", exit 2).
LABEL="@LABEL@"
SCRIPT="@SCRIPT@"
TARGETNAME="@TARGETNAME@"
MD5="@MD5@"
SKIP=@SKIP@
USIZE_KB=@USIZE_KB@
REQ_BYTES=@REQ_BYTES@
# the lab may shrink the unpack requirement (its default is the real figure)
if [ -n "@REQ_ENV@" ]; then eval "REQ_BYTES=\${@REQ_ENV@:-$REQ_BYTES}"; fi
ME="$0"
extract=0; keep=0; nodiskspace=0; check_only=0; target=""; tmproot="${TMPDIR:-/tmp}"; prev=""
for a in "$@"; do
    if [ "$prev" = target ]; then target="$a"; prev=""; continue; fi
    case "$a" in
        --check) check_only=1 ;;
        --info)
            echo "Identification: $LABEL"
            echo "Target directory: $TARGETNAME"
            echo "Uncompressed size: $USIZE_KB KB"
            echo "Compression: gzip"
            echo "Date of packaging: @DATE@"
            echo "Built with Makeself version 2.1.5"
            exit 0 ;;
        --list) tail -n +"$SKIP" "$ME" | gzip -dc | tar tvf -; exit 0 ;;
        -x|--extract-only) extract=1 ;;
        --target) prev=target ;;
        --keep) keep=1 ;;
        --nodiskspace) nodiskspace=1 ;;
        --tmpdir=*) tmproot="${a#--tmpdir=}" ;;
    esac
done

if [ "$extract" = 0 ] && [ "$nodiskspace" = 0 ] && [ "$REQ_BYTES" -gt 0 ] 2>/dev/null; then
    need_kb=$(( (REQ_BYTES + 1023) / 1024 ))
    if [ ! -d "$tmproot" ]; then
        echo "Temporary directory $tmproot does not exist." >&2
        exit 1
    fi
    left_kb=$(df -kP "$tmproot" 2>/dev/null | awk 'NR==2 {print $4}')
    if [ -n "$left_kb" ] && [ "$left_kb" -lt "$need_kb" ]; then
        echo
        echo "Not enough space left in $tmproot ($left_kb KB) to decompress $ME ($need_kb KB)" >&2
        echo "Use --nodiskspace option to skip this check and proceed anyway" >&2
        echo "Consider setting TMPDIR to a directory with more free space."
        exit 1
    fi
fi

printf "Verifying archive integrity... "
sum=$(tail -n +"$SKIP" "$ME" | md5sum | cut -d' ' -f1)
if [ "$sum" != "$MD5" ]; then
    echo
    echo "Error in MD5 checksums: $sum is different from $MD5" >&2
    exit 2
fi
echo "All good."
[ "$check_only" = 1 ] && exit 0

if [ "$extract" = 1 ]; then
    dest="${target:-$TARGETNAME}"
    mkdir -p "$dest" || exit 1
    printf "Uncompressing %s" "$LABEL"
    tail -n +"$SKIP" "$ME" | gzip -dc | (cd "$dest" && tar xf -) || { echo; echo "Extraction failed." >&2; exit 1; }
    echo "........"
    exit 0
fi

tmpdir=$(mktemp -d "$tmproot/makeself.XXXXXXXX") || { echo "Cannot create temporary directory in $tmproot" >&2; exit 1; }
printf "Uncompressing %s" "$LABEL"
if ! tail -n +"$SKIP" "$ME" | gzip -dc | (cd "$tmpdir" && tar xf -); then
    echo
    echo "Extraction failed." >&2
    rm -rf "$tmpdir"
    exit 1
fi
echo "  100%"
P40LAB_RUNFILE="$ME"; export P40LAB_RUNFILE
# run the installer as a child; a TERM/INT/HUP to this process stops it too (and cleans up)
exec 3<&0
(cd "$tmpdir" && exec sh "./$SCRIPT" "$@" <&3) &
child=$!
trap 'kill -TERM $child 2>/dev/null; wait $child 2>/dev/null; rm -rf "$tmpdir"; exit 143' TERM INT HUP
wait $child
res=$?
[ "$keep" = 1 ] || rm -rf "$tmpdir"
exit $res
