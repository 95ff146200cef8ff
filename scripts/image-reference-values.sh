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
#   - the versions of the tools and of the kernel and systemd packages;
#   - with INFERNO_OVMF_AMDSEV=PATH (the AmdSev OVMF, scripts/ovmf-amdsev-build.sh), the SEV-SNP
#     launch measurement of measured direct boot for each CPU product (the QEMU vCPU model named
#     after it) and each vCPU count in INFERNO_SNP_VCPUS (default "1 2 4 8 16 32 64"), computed
#     by sev-snp-measure (PyPI; SEV_SNP_MEASURE names the command) and by the sev crate through
#     `cargo run -p inferno-attestation --example snp_launch_measurement`. The script fails if
#     the two implementations disagree on any value. Without it the [sev_snp] list stays empty;
#   - with INFERNO_TDVF=PATH (the TDX firmware, scripts/tdvf-build.sh), the MRTD of a TD built
#     from it (in both orders a host may add its pages in), computed by `cargo run -p inferno-attestation --example tdx_mrtd`
#     (inferno_attestation::tdx_measurement), which refuses to print a value the igvm crate's
#     independent implementation of the TDX module's hashing disagrees on. Without it the
#     [tdx] mrtd list stays empty. RTMR0-2 are not enforced (docs/deploy-airgapped.md, section 7);
#     RTMR2 of measured direct boot and its event digests are recorded in [inputs].
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

# SEV-SNP: the product -> QEMU vCPU model mapping is attestation/src/snp_measurement.rs's
# PRODUCT_VCPU_TYPES (a test checks that the two agree).
snp_products="Milan:EPYC-Milan Genoa:EPYC-Genoa Turin:EPYC-Turin"
snp_vcpus=${INFERNO_SNP_VCPUS:-1 2 4 8 16 32 64}
ovmf=${INFERNO_OVMF_AMDSEV:-}
snp_lines=()
if [ -n "$ovmf" ]; then
    ovmf=$(realpath "$ovmf")
    sev_snp_measure=${SEV_SNP_MEASURE:-sev-snp-measure}
    snp_measure_version=$($sev_snp_measure --version) ||
        { echo "$sev_snp_measure is missing: pip install sev-snp-measure (or set SEV_SNP_MEASURE)" >&2; exit 1; }
    sev_crate_version=$(grep -A1 '^name = "sev"$' "$here/Cargo.lock" | sed -n 's/^version = "\(.*\)"/\1/p')
    vcpu_types=$(for p in $snp_products; do printf '%s,' "${p#*:}"; done)
    mapfile -t rust_lines < <(cd "$here" && cargo run -q -p inferno-attestation \
        --example snp_launch_measurement -- "$ovmf" "$out/$name.vmlinuz" "$out/$name.initrd" \
        "$cmdline" "${vcpu_types%,}" "$(echo $snp_vcpus | tr ' ' ,)")
    for p in $snp_products; do
        product=${p%%:*} vcpu_type=${p#*:}
        for n in $snp_vcpus; do
            python_value=$($sev_snp_measure --mode snp --vmm-type QEMU --vcpus "$n" \
                --vcpu-type "$vcpu_type" --ovmf "$ovmf" --kernel "$name.vmlinuz" \
                --initrd "$name.initrd" --append "$cmdline" --output-format hex)
            rust_value=$(printf '%s\n' "${rust_lines[@]}" | sed -n "s/^$vcpu_type $n //p")
            if [ "$python_value" != "$rust_value" ]; then
                echo "SEV-SNP measurement of $vcpu_type x$n: sev-snp-measure gives $python_value, the sev crate ${rust_value:-nothing}" >&2
                exit 1
            fi
            snp_lines+=("    { product = \"$product\", vcpus = $n, measurement = \"$python_value\" },")
        done
    done
fi

# TDX: MRTD follows from the firmware alone.
tdvf=${INFERNO_TDVF:-}
mrtd=
if [ -n "$tdvf" ]; then
    tdvf=$(realpath "$tdvf")
    tdx_lines=$(cd "$here" && cargo run -q -p inferno-attestation --example tdx_mrtd -- \
        "$tdvf" "$out/$name.initrd" "$cmdline")
    tdx_value() { printf '%s\n' "$tdx_lines" | sed -n "s/^$1 //p"; }
    mrtd=$(tdx_value mrtd)
    mrtd_per_section=$(tdx_value mrtd_per_section)
    [ -n "$mrtd" ] && [ -n "$mrtd_per_section" ] && [ -n "$(tdx_value rtmr2)" ] ||
        { echo "tdx_mrtd computed no MRTD or RTMR2 for $tdvf" >&2; exit 1; }
    crate_version() { grep -A1 "^name = \"$1\"$" "$here/Cargo.lock" | sed -n 's/^version = "\(.*\)"/\1/p'; }
    attestation_version=$(crate_version inferno-attestation)
    igvm_version=$(crate_version igvm)
fi

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
TOML
if [ -n "$ovmf" ]; then
    cat <<TOML
# The AmdSev OVMF of the SEV-SNP measurements (scripts/ovmf-amdsev-build.sh prints the recipe),
# and the launch configuration they assume: QEMU with kernel-hashes=on, the default SEV-SNP
# guest features (SNP active only), and the vCPU model named after each CPU product.
ovmf_amdsev_sha256 = "$(sha "$ovmf")"
ovmf_amdsev_build = "$(head -1 "$ovmf.build-info" 2>/dev/null || echo "unknown: no $ovmf.build-info")"
ovmf_amdsev_toolchain = "$(tail -n +2 "$ovmf.build-info" 2>/dev/null | paste -sd ';' | sed 's/;/; /g')"
snp_vmm = "QEMU, kernel-hashes=on"
snp_guest_features = "0x1"
snp_vcpu_types = "$snp_products"
TOML
fi
if [ -n "$tdvf" ]; then
    cat <<TOML
# The TDX firmware (TDVF) of the MRTD below (scripts/tdvf-build.sh prints the recipe), and the
# host stack it assumes: the host must launch with exactly this file (-bios), and MRTD also
# depends on the order in which the host adds and measures the firmware's pages.
tdvf_sha256 = "$(sha "$tdvf")"
tdvf_build = "$(head -1 "$tdvf.build-info" 2>/dev/null || echo "unknown: no $tdvf.build-info")"
tdvf_toolchain = "$(tail -n +2 "$tdvf.build-info" 2>/dev/null | paste -sd ';' | sed 's/;/; /g')"
tdx_vmm = "QEMU and KVM: sections in metadata order; per page (upstream KVM: each page added, then its 256-byte chunks extended) or per section (earlier stacks: all pages added, then all extended)"
# RTMR2 of measured direct boot as the artifacts determine it: the kernel's EFI stub measures the
# UEFI load options (the command line plus " initrd=initrd", UTF-16 with a NUL), then the initrd.
# NOT enforced ([tdx] lists no rtmr2): no TD launch has shown this value in its event log yet.
tdx_load_options = "$cmdline initrd=initrd"
tdx_load_options_sha384 = "$(tdx_value load_options_sha384)"
initrd_sha384 = "$(tdx_value initrd_sha384)"
tdx_rtmr2_direct_boot = "$(tdx_value rtmr2)"
TOML
fi
cat <<TOML

[tools]
mkosi = "$(info mkosi)"
systemd_measure = "$measure_version"
linux_image = "$(pkg linux-image-amd64)"
systemd = "$(pkg systemd)"
TOML
if [ -n "$ovmf" ]; then
    cat <<TOML
sev_snp_measure = "$snp_measure_version"
sev_crate = "$sev_crate_version"
TOML
fi
if [ -n "$tdvf" ]; then
    cat <<TOML
tdx_mrtd = "inferno-attestation $attestation_version (tdx_measurement)"
igvm_crate = "$igvm_version"
TOML
fi
cat <<TOML

[sev_snp]
TOML
if [ -n "$ovmf" ]; then
    cat <<TOML
# Launch measurements for measured direct boot with the OVMF, kernel, initrd and command line
# above, per CPU product and vCPU count; sev-snp-measure and the sev crate agree on each.
measurements = [
$(printf '%s\n' "${snp_lines[@]}")
]
TOML
else
    cat <<TOML
# Launch measurements per CPU product and vCPU count for measured direct boot. NOT COMPUTED: they
# need the AmdSev OVMF (scripts/ovmf-amdsev-build.sh; INFERNO_OVMF_AMDSEV). The list is empty,
# so the production policy accepts no SEV-SNP evidence until it is filled: a rejection names the
# measurement.
measurements = []
TOML
fi
if [ -n "$tdvf" ]; then
    cat <<TOML

[tdx]
# MRTD of a TD built from the TDVF above: first as upstream KVM adds the pages (each page,
# then its chunks; inferno_attestation::tdx_measurement and the igvm crate agree on it), then
# as earlier host stacks do (a section's pages added, then extended). Both pin the same bytes.
# RTMR0-2 are not listed (any value passes): RTMR0 and RTMR1 depend on the host (ACPI tables,
# memory size, QEMU's kernel header patching), and RTMR2 ([inputs] tdx_rtmr2_direct_boot)
# awaits confirmation by a TD launch (docs/deploy-airgapped.md, section 7).
mrtd = ["$mrtd", "$mrtd_per_section"]
TOML
else
    cat <<TOML

[tdx]
# MRTD NOT COMPUTED: it needs the TDX firmware the host launches (scripts/tdvf-build.sh;
# INFERNO_TDVF). Empty: the production policy accepts no TDX evidence until it is filled.
mrtd = []
TOML
fi
cat <<TOML

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
