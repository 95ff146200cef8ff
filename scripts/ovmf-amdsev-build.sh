#!/usr/bin/env bash
# scripts/ovmf-amdsev-build.sh [OUTDIR]: build the AmdSev OVMF (OvmfPkg/AmdSev/AmdSevX64.dsc)
# from Debian trixie's edk2 source package, the firmware whose SEV hashes table lets an SEV-SNP
# guest boot a kernel, initrd and command line by measured direct boot (QEMU kernel-hashes=on).
# No Debian package ships this build (ovmf 2025.02 has no OVMF.amdsev.fd), so the reference values
# of the appliance image (scripts/image-reference-values.sh, INFERNO_OVMF_AMDSEV) need it built:
#   scripts/ovmf-amdsev-build.sh OUTDIR   # writes OUTDIR/OVMF.amdsev.fd(.build-info), prints its SHA-256
#
# The recipe, so that anyone can rebuild the same firmware and compare its SHA-256:
#   - source: edk2 2025.02-8+deb13u1 from Debian trixie (`apt-get source edk2` needs a trixie
#     deb-src entry), the upstream tarball with Debian's patches (debian/patches/series) applied;
#     the SHA-256 of both tarballs is checked below;
#   - toolchain: the build machine's gcc (GCC5 edk2 profile), nasm and iasl (Debian packages
#     nasm, acpica-tools or iasl, uuid-dev, build-essential, python3); the versions are printed;
#   - build: BaseTools, then `build -a X64 -t GCC5 -b RELEASE -p OvmfPkg/AmdSev/AmdSevX64.dsc`
#     with the default defines, from scratch, in the FIXED directory /tmp/inferno-ovmf-amdsev:
#     the firmware's bytes depend on the path it is built in (two builds in different
#     directories differed in a few modules), so the path is part of the recipe;
#   - grub: AmdSevX64 bundles a grub.efi (OvmfPkg/AmdSev/Grub, for booting a LUKS disk with an
#     injected secret). The appliance boots by measured direct boot and never uses it, so the
#     build bundles an EMPTY grub.efi placeholder (the same choice other confidential-VM stacks
#     make); the empty file is part of the firmware volume and hence of the measured image.
# Two builds in that directory with the same toolchain give the same bytes; a different gcc or
# nasm gives a different SHA-256 and, through the OVMF pages, a different launch measurement.
set -euo pipefail
work=/tmp/inferno-ovmf-amdsev
out=$(realpath -m "${1:-$work}")
version=2025.02
debian_revision=8+deb13u1
orig_sha256=b63b6053d6d89c74d9291f9e96fde1584be99e6fb9c169ba9511505129d6b049
debian_sha256=e2a7f6fc58640818416a028d6d5e9dfc255697a7cdc60c14566c236df6bd9b08

for tool in gcc make nasm iasl python3 patch sha256sum; do
    command -v "$tool" >/dev/null || {
        echo "ovmf-amdsev-build: $tool is missing (apt-get install build-essential nasm acpica-tools uuid-dev python3)" >&2
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
    [ -f "$1" ] || { echo "ovmf-amdsev-build: $work/$1 is missing (add a trixie deb-src entry, or download it from the Debian archive)" >&2; exit 1; }
    [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ] || { echo "ovmf-amdsev-build: $1 does not have SHA-256 $2" >&2; exit 1; }
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
# The empty grub.efi placeholder, newer than grub.cfg and grub.sh so that the PREBUILD step
# (OvmfPkg/AmdSev/Grub/grub.sh) keeps it instead of building grub.
: >OvmfPkg/AmdSev/Grub/grub.efi
touch -d '+1 minute' OvmfPkg/AmdSev/Grub/grub.efi

export PYTHON_COMMAND=python3
set +u --
# shellcheck disable=SC1091
. ./edksetup.sh >&2
set -u
make -C BaseTools -j"$(nproc)" >&2
rm -rf Build
build -a X64 -t GCC5 -b RELEASE -n "$(nproc)" -p OvmfPkg/AmdSev/AmdSevX64.dsc >&2
cp Build/AmdSev/RELEASE_GCC5/FV/OVMF.fd "$out/OVMF.amdsev.fd"
{
    echo "edk2 $version-$debian_revision (Debian trixie source), AmdSevX64.dsc RELEASE GCC5, empty grub.efi"
    gcc --version | head -1
    nasm -v
    iasl -v 2>/dev/null | sed -n 's/.*Compiler.*version/iasl version/p' | head -1
} >"$out/OVMF.amdsev.fd.build-info"
echo "$out/OVMF.amdsev.fd $(sha256sum "$out/OVMF.amdsev.fd" | cut -d' ' -f1)"
