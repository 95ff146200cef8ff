#!/usr/bin/env bash
# scripts/image-reference-values.sh [OUTDIR] [NAME]: write the reference values of a built image
# (image/build's OUTDIR, default image/out; NAME inferno or inferno-development) to stdout in the
# format of policy/reference-values.toml. Every value is recomputable from the artifacts:
#   - the SEV hashes table's inputs: SHA-256 of the kernel, of the initrd, and of the command
#     line plus its terminating NUL (what QEMU's kernel-hashes=on puts into the AmdSev OVMF);
#   - the UKI's SHA-256 and the dm-verity root hash it pins;
#   - PCR 11 (SHA-256 bank) as systemd-stub extends it from the UKI's sections, computed with
#     the tools tree's systemd-measure;
#   - the versions of the tools and of the kernel and systemd packages.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath "${1:-$here/image/out}")
name=${2:-inferno}
cd "$out"
sha() { sha256sum "$1" | cut -d' ' -f1; }
cmdline=$(tr -d '\0' <"$name.cmdline")
cmdline_sha=$( { printf '%s' "$cmdline"; printf '\0'; } | sha256sum | cut -d' ' -f1)
roothash=$(printf '%s\n' $cmdline | sed -n 's/^roothash=//p')
pkg() { jq -r --arg p "$1" '.packages[] | select(.name == $p) | .version' "$name.manifest"; }

# PCR 11: systemd-stub measures the UKI's sections; systemd-measure from the build's tools tree
# computes the value from the same sections.
work=$(mktemp -d -p "$out/tools/tmp")
trap 'rm -rf "$work"' EXIT
measure_args=()
for section in linux osrel cmdline initrd uname sbat; do
    objcopy -O binary --only-section=".$section" "$name.efi" "$work/$section"
    measure_args+=("--$section=/tmp/$(basename "$work")/$section")
done
# One value per boot phase: in the initrd, after leaving it, at sysinit, and once booted.
mapfile -t pcr11 < <(chroot "$out/tools" /usr/lib/systemd/systemd-measure calculate \
    --bank=sha256 "${measure_args[@]}" 2>/dev/null | sed -n 's/^11:sha256=//p')
[ "${#pcr11[@]}" = 4 ] || { echo "systemd-measure gave ${#pcr11[@]} PCR 11 values, not 4" >&2; exit 1; }
measure_version=$(chroot "$out/tools" /usr/lib/systemd/systemd-measure --version | head -1)

cat <<TOML
# Reference values of the Inferno appliance image, written by scripts/image-reference-values.sh
# from image/build's artifacts. docs/deploy-airgapped.md, section 7, explains each value.
schema = 1
image = "$name"
source_date_epoch = ${SOURCE_DATE_EPOCH:-$(git -C "$here" log -1 --format=%ct)}

[guest_policy]
# SEV-SNP guest policy the image is launched with: debug off, migration agent off, SMT allowed.
debug = false
migration_agent = false
smt = true

[inputs]
# SHA-256 of each artifact, so that anyone can recompute the measurements.
uki_sha256 = "$(sha "$name.efi")"
kernel_sha256 = "$(sha "$name.vmlinuz")"
initrd_sha256 = "$(sha "$name.initrd")"
# The command line, and the SHA-256 of it plus its NUL (the SEV hashes table's entry).
cmdline = "$cmdline"
cmdline_nul_sha256 = "$cmdline_sha"
roothash = "$roothash"

[tools]
mkosi = "$(${MKOSI:-mkosi} --version | awk '{print $2}')"
systemd_measure = "$measure_version"
linux_image = "$(pkg linux-image-amd64)"
systemd = "$(pkg systemd)"

[tpm.pcr11_sha256]
# PCR 11 (SHA-256 bank): systemd-stub's measurement of the UKI's sections, then the boot phases
# systemd-pcrphase adds. A quote taken while serving shows "ready".
enter_initrd = "${pcr11[0]}"
leave_initrd = "${pcr11[1]}"
sysinit = "${pcr11[2]}"
ready = "${pcr11[3]}"

[sev_snp]
# Launch measurements per CPU product and vCPU count: not computed yet (needs the AmdSev OVMF
# built from Debian's edk2 source; docs/deploy-airgapped.md, section 7).
measurements = []

[tdx]
# MRTD and RTMR1-2: not computed yet (needs the TDVF build).
mrtd = []
TOML
