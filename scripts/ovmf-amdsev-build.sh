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
# shellcheck source=scripts/lib-edk2.sh
. "$(dirname "$0")/lib-edk2.sh"
work=/tmp/inferno-ovmf-amdsev
out=$(realpath -m "${1:-$work}")
mkdir -p "$out"
edk2_prepare ovmf-amdsev-build "$work"
# The empty grub.efi placeholder, newer than grub.cfg and grub.sh so that the PREBUILD step
# (OvmfPkg/AmdSev/Grub/grub.sh) keeps it instead of building grub.
: >OvmfPkg/AmdSev/Grub/grub.efi
touch -d '+1 minute' OvmfPkg/AmdSev/Grub/grub.efi
edk2_build OvmfPkg/AmdSev/AmdSevX64.dsc
edk2_finish Build/AmdSev/RELEASE_GCC5/FV/OVMF.fd "$out/OVMF.amdsev.fd" "AmdSevX64.dsc RELEASE GCC5, empty grub.efi"
