#!/usr/bin/env bash
# scripts/image-reference-values.sh [OUTDIR] [NAME]: write the reference values of a built image
# (image/build's OUTDIR, default image/out; NAME inferno or inferno-development) to stdout in the
# format of policy/reference-values.toml, which policy/production.toml names (its `reference_values`
# key) and every verifier applies (attestation/src/reference_values.rs; docs/policy.md):
#   scripts/image-reference-values.sh image/out inferno >policy/reference-values.toml
# Every value is recomputable from the artifacts:
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
[ -f "$name.build-info" ] || { echo "$out/$name.build-info is missing: rebuild with image/build" >&2; exit 1; }
info() { sed -n "s/^$1=//p" "$name.build-info"; }
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
# from image/build's artifacts. policy/production.toml names this file: every verifier applies
# these values, and evidence whose measurement or PCR is not listed fails its appraisal.
# docs/deploy-airgapped.md, section 7, explains each value and how to recompute it.
schema = 1
image = "$name"
commit = "$(info commit)"
source_date_epoch = $(info source_date_epoch)

[guest_policy]
# The SEV-SNP guest policy the image is launched with (documentation: the policy's [sev_snp]
# allow_* rules decide what is accepted): debug off, migration agent off, SMT allowed.
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
# The inferno binary in the root (stripped), and how it was built.
inferno_sha256 = "$(info inferno_sha256)"
inferno_origin = "$(info inferno_origin)"
manifest_sha256 = "$(sha "$name.manifest")"

[tools]
mkosi = "$(info mkosi)"
systemd_measure = "$measure_version"
linux_image = "$(pkg linux-image-amd64)"
systemd = "$(pkg systemd)"

[sev_snp]
# Launch measurements per CPU product and vCPU count for measured direct boot. NOT COMPUTED: they
# need the AmdSev OVMF (with the SEV hashes table), which no Debian package ships and which was
# not built here. The list is empty, so the production policy accepts no SEV-SNP evidence until
# it is filled: a rejection names the measurement.
measurements = []

[tdx]
# MRTD (and RTMR1-2) NOT COMPUTED: they need the TDVF build the host launches. Empty: the
# production policy accepts no TDX evidence until it is filled.
mrtd = []

[tpm.sha256]
# PCR 11: systemd-stub's measurement of the UKI's sections followed by systemd-pcrphase's boot
# phases. inferno.service starts after the "ready" phase, so the server's quotes show this value.
11 = ["${pcr11[3]}"]

[tpm.pcr11_boot_phases]
# PCR 11 after each phase, for diagnosing a quote taken earlier (not accepted by the policy).
enter_initrd = "${pcr11[0]}"
leave_initrd = "${pcr11[1]}"
sysinit = "${pcr11[2]}"
ready = "${pcr11[3]}"
TOML
