#!/usr/bin/env bash
# scripts/tdvf-build.sh [OUTDIR]: build the TDX firmware (TDVF: OvmfPkg/IntelTdx/IntelTdxX64.dsc)
# from Debian trixie's edk2 source package, the firmware an Intel TDX host launches the appliance
# with. Its MRTD (the TD's build-time measurement) follows from its bytes alone, so the reference
# values of the image (scripts/image-reference-values.sh, INFERNO_TDVF) need this exact build:
#   scripts/tdvf-build.sh OUTDIR   # writes OUTDIR/OVMF.inteltdx.fd(.build-info), prints its SHA-256
#
# The recipe, so that anyone can rebuild the same firmware and compare its SHA-256:
#   - source: edk2 2025.02-8+deb13u1 from Debian trixie (`apt-get source edk2` with a trixie
#     deb-src entry, or the two tarballs from the Debian archive's pool/main/e/edk2/), the
#     upstream tarball with Debian's patches (debian/patches/series) applied; the SHA-256 of both
#     tarballs is checked below (the same source as scripts/ovmf-amdsev-build.sh);
#   - toolchain: the build machine's gcc (GCC5 edk2 profile), nasm and iasl (Debian packages
#     nasm, acpica-tools or iasl, uuid-dev, build-essential, python3); the versions are recorded;
#   - build: BaseTools, then `build -a X64 -t GCC5 -b RELEASE -p OvmfPkg/IntelTdx/IntelTdxX64.dsc`
#     with the default defines (a single 4 MiB image, code and variable store together, since a
#     TD's firmware is measured as one image), from scratch, in the FIXED directory
#     /tmp/inferno-tdvf: the firmware's bytes depend on the path it is built in, so the path is
#     part of the recipe.
# Two builds in that directory with the same toolchain give the same bytes; a different gcc or
# nasm gives a different SHA-256 and a different MRTD.
set -euo pipefail
# shellcheck source=scripts/lib-edk2.sh
. "$(dirname "$0")/lib-edk2.sh"
work=/tmp/inferno-tdvf
out=$(realpath -m "${1:-$work}")
mkdir -p "$out"
dsc=OvmfPkg/IntelTdx/IntelTdxX64.dsc
edk2_prepare tdvf-build "$work"
[ -f "$dsc" ] || { echo "tdvf-build: $dsc is missing from edk2 $edk2_version" >&2; exit 1; }
edk2_build "$dsc"
edk2_finish Build/IntelTdx/RELEASE_GCC5/FV/OVMF.fd "$out/OVMF.inteltdx.fd" "IntelTdxX64.dsc RELEASE GCC5"
