#!/usr/bin/env bash
# Runs on the GPU machine from the project root, copied by collectives/tools/devbitcode.sh as
# .devwheels/c/install.sh: puts NVSHMEM's device bitcode where nvshmem4py's find_device_bitcode_library
# (and ptxops.nvshmem.bitcode_path) look: the lib/ beside the include/ that cuda.pathfinder finds for
# "nvshmem" (the image's nvidia-nvshmem-cu13), with nvshmem4py from /tmp/site on the path.  Prints the
# image's NVSHMEM version and the staged one's; where they differ and the host library was staged
# (WITH_HOST=1), installs it too (the bitcode must match the host library that initialises it).
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
(cd "$src" && sha256sum -c --quiet SHA256SUMS)
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
info=$(python3 - <<'PY'
import importlib.metadata, re
from pathlib import Path
from cuda.pathfinder import find_nvidia_header_directory
include = Path(find_nvidia_header_directory("nvshmem"))
print(include.parent / "lib")
try:
    print(importlib.metadata.version("nvidia-nvshmem-cu13"))
except importlib.metadata.PackageNotFoundError:
    h = (include / "non_abi" / "nvshmem_version.h").read_text()
    print(".".join(re.search(rf"NVSHMEM_VENDOR_{p}_VERSION (\d+)", h)[1] for p in ("MAJOR", "MINOR", "PATCH")))
PY
)
lib=$(sed -n 1p <<<"$info")
image=$(sed -n 2p <<<"$info")
staged=$(cat "$src/NVSHMEM_VERSION")
echo "devbitcode: the image's NVSHMEM $image in $lib; the staged bitcode's NVSHMEM $staged"
[[ -w $lib ]] || { echo "devbitcode: $lib is not writable: cannot install the bitcode" >&2; exit 1; }
for f in "$src"/libnvshmem_device_sm_*.bc.xz; do
    xz -dc "$f" > "$lib/$(basename "$f" .xz)"
    echo "devbitcode: installed $lib/$(basename "$f" .xz)"
done
if [[ $image != "$staged" ]]; then
    if [[ -f $src/libnvshmem_host.so.3.xz ]]; then
        for f in libnvshmem_host.so.3 nvshmem_bootstrap_uid.so.3; do
            [[ -f $lib/$f ]] && cp "$lib/$f" "$lib/$f.image"
            xz -dc "$src/$f.xz" > "$lib/$f"
        done
        echo "devbitcode: versions differ: installed the staged NVSHMEM $staged host library (the image's kept as *.image)"
    else
        echo "devbitcode: WARNING: versions differ and no host library was staged; if a kernel fails NVSHMEM's" \
             "version check, stage again with WITH_HOST=1 bash collectives/tools/devbitcode.sh" >&2
    fi
fi
python3 -c 'from nvshmem.core.init_fini import find_device_bitcode_library as f; print("devbitcode: nvshmem4py finds", f(arch=90))'
