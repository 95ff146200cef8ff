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
work=/tmp/inferno-tdvf
out=$(realpath -m "${1:-$work}")
version=2025.02
debian_revision=8+deb13u1
orig_sha256=b63b6053d6d89c74d9291f9e96fde1584be99e6fb9c169ba9511505129d6b049
debian_sha256=e2a7f6fc58640818416a028d6d5e9dfc255697a7cdc60c14566c236df6bd9b08
dsc=OvmfPkg/IntelTdx/IntelTdxX64.dsc

for tool in gcc make nasm iasl python3 patch sha256sum nice; do
    command -v "$tool" >/dev/null || {
        echo "tdvf-build: $tool is missing (apt-get install build-essential nasm acpica-tools uuid-dev python3)" >&2
        exit 1
    }
done
mkdir -p "$work" "$out"
cd "$work"
orig=edk2_$version.orig.tar.xz
debian=edk2_$version-$debian_revision.debian.tar.xz
if [ ! -f "$orig" ] || [ ! -f "$debian" ]; then
    # The .dsc is not needed: both tarballs are checked against the hashes above.
    apt-get source --download-only "edk2=$version-$debian_revision" >&2 || true
fi
check() {
    [ -f "$1" ] || { echo "tdvf-build: $work/$1 is missing (add a trixie deb-src entry, or download it from the Debian archive)" >&2; exit 1; }
    [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ] || { echo "tdvf-build: $1 does not have SHA-256 $2" >&2; exit 1; }
}
check "$orig" "$orig_sha256"
check "$debian" "$debian_sha256"

src=$work/edk2-$version
if [ ! -f "$src/.inferno-patched" ]; then
    rm -rf "$src"
    tar xf "$orig"
    tar xf "$debian" -C "$src"
    while read -r p; do
        case "$p" in ''|'#'*) continue ;; esac
        patch -d "$src" -p1 -s <"$src/debian/patches/$p"
    done <"$src/debian/patches/series"
    touch "$src/.inferno-patched"
fi
cd "$src"
[ -f "$dsc" ] || { echo "tdvf-build: $dsc is missing from edk2 $version" >&2; exit 1; }

export PYTHON_COMMAND=python3
set +u --
# shellcheck disable=SC1091
. ./edksetup.sh >&2
set -u
nice -n 10 make -C BaseTools -j"$(nproc)" >&2
rm -rf Build
nice -n 10 build -a X64 -t GCC5 -b RELEASE -n "$(nproc)" -p "$dsc" >&2
cp Build/IntelTdx/RELEASE_GCC5/FV/OVMF.fd "$out/OVMF.inteltdx.fd"
{
    echo "edk2 $version-$debian_revision (Debian trixie source), IntelTdxX64.dsc RELEASE GCC5"
    gcc --version | head -1
    nasm -v
    iasl -v 2>/dev/null | sed -n 's/.*Compiler.*version/iasl version/p' | head -1
} >"$out/OVMF.inteltdx.fd.build-info"
echo "$out/OVMF.inteltdx.fd $(sha256sum "$out/OVMF.inteltdx.fd" | cut -d' ' -f1)"
