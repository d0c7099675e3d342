#!/usr/bin/env bash
# Stage NVSHMEM's device bitcode for the GPU machine, whose nvidia-nvshmem-cu13 lacks it (without it
# no kernel using ptxops.nvshmem links: the all-to-all's transport="nvshmem", the NVSHMEM ring tests).
# Run HERE, from the project root, after ../shared/device/prepare.sh (it makes .devwheels/a, b):
#     bash collectives/tools/devbitcode.sh            # -> .devwheels/c: the bitcode xz-compressed + install.sh
#     WITH_HOST=1 bash collectives/tools/devbitcode.sh   # also this machine's host library and uid bootstrap
# (WITH_HOST: for an image whose NVSHMEM is another version than this one's: the bitcode linked into a
# kernel must match the host library that fills its device state.)
# On the GPU machine, one device call after .devwheels/a and b are installed:
#     bash .devwheels/c/install.sh && source /tmp/devenv.sh && <command>     carry [".devwheels/c"]
# install.sh prints the image's NVSHMEM version and this one's, and puts the bitcode where nvshmem4py's
# find_device_bitcode_library looks (the lib/ beside the include/ that cuda.pathfinder finds for "nvshmem").
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
ARCH=${ARCH:-90}
out=.devwheels/c
info=$(python3 - "$ARCH" <<'PY'
import importlib.metadata, sys
from pathlib import Path
from cuda.pathfinder import find_nvidia_header_directory
include = Path(find_nvidia_header_directory("nvshmem"))
print(include.parent / "lib")
print(importlib.metadata.version("nvidia-nvshmem-cu13"))
PY
)
lib=$(sed -n 1p <<<"$info")
version=$(sed -n 2p <<<"$info")
bc="$lib/libnvshmem_device_sm_${ARCH}.bc"
[[ -f $bc ]] || { echo "devbitcode: no $bc here (pip install -e '.[nvshmem]')" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out"
echo "devbitcode: compressing $bc (NVSHMEM $version; about a minute)"
xz -T2 -6 -c "$bc" > "$out/$(basename "$bc").xz"
if [[ ${WITH_HOST:-0} == 1 ]]; then
    for f in libnvshmem_host.so.3 nvshmem_bootstrap_uid.so.3; do xz -T2 -6 -c "$lib/$f" > "$out/$f.xz"; done
fi
echo "$version" > "$out/NVSHMEM_VERSION"
(cd "$out" && sha256sum ./*.xz > SHA256SUMS)
cp "$root/collectives/tools/devbitcode_install.sh" "$out/install.sh"
du -sh "$out"/*
total=$(du -sb "$out" | cut -f1)
(( total <= 40 * 1024 * 1024 )) || { echo "devbitcode: $out is $total bytes, above 40 MB" >&2; exit 1; }
echo "next (GPU machine, after .devwheels/a and b): bash .devwheels/c/install.sh, carry [\".devwheels/c\"]"
