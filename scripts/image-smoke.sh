#!/usr/bin/env bash
# scripts/image-smoke.sh [IMAGE_DIR]: boot the development variant of the appliance image under
# qemu-system-x86_64 with TCG (no KVM, -cpu qemu64) and check that it serves.
#
# IMAGE_DIR holds inferno-development.qcow2 (default image/out-dev; build it with
#   IMAGE_PROFILE=development image/build image/out-dev).
# Needs qemu-system-x86, ovmf, swtpm, curl, jq and an inferno binary built with the default
# features (SMOKE_INFERNO, default $CARGO_TARGET_DIR/debug/inferno). Checks, each under a timeout:
#   - the serial console shows the server's "ready" banner;
#   - the root is erofs, mounted read-only, from /dev/mapper/root, whose table is dm-verity, and
#     the command line carries roothash=;
#   - the data partition was created on first boot, LUKS-encrypted with a key sealed to the
#     (software) TPM, and is mounted on /var/lib/inferno;
#   - PCR 11 of the (software) vTPM equals the value computed from the UKI's sections;
#   - GET /health answers 200 and a chat completion answers, through a forwarded port;
#   - `inferno verify` trusts the server under policy/client-development.toml, fresh evidence
#     bound to its own TLS connection included;
#   - the server's evidence (GET /v1/attestation), appraised on the host with `inferno attest
#     verify` under the development policy plus the reference values computed from the image,
#     passes with PCR 11 checked, and fails, naming PCR 11, under another PCR 11 value.
# Prints PASS or the failing check, and leaves the serial log in $SMOKE_WORK (default: a temp dir).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
images=$(realpath "${1:-$here/image/out-dev}")
timeout_s=${SMOKE_TIMEOUT:-900}
port=${SMOKE_PORT:-18443}
key=inferno-smoke-test-key
# The inferno binary that appraises the server's evidence on the host.
inferno=${SMOKE_INFERNO:-${CARGO_TARGET_DIR:-$here/target}/debug/inferno}
# Checked before the (minutes-long) boot rather than when first needed.
[ -x "$inferno" ] ||
    { echo "FAIL: no inferno binary at $inferno: run 'cargo build --locked' or set SMOKE_INFERNO" >&2; exit 1; }
[ -f "$images/inferno-development.qcow2" ] ||
    { echo "FAIL: no $images/inferno-development.qcow2: run IMAGE_PROFILE=development image/build $images" >&2; exit 1; }
work=${SMOKE_WORK:-$(mktemp -d)}
mkdir -p "$work"
serial="$work/serial.log"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; echo "serial log: $serial" >&2; exit 1; }

# A copy of the disk with room for the data partition that first boot creates.
qemu-img create -q -f qcow2 -F qcow2 -b "$images/inferno-development.qcow2" "$work/disk.qcow2" 3G
cp /usr/share/OVMF/OVMF_VARS_4M.fd "$work/vars.fd"

mkdir -p "$work/tpm"
swtpm socket --tpm2 --tpmstate dir="$work/tpm" --ctrl type=unixio,path="$work/tpm.sock" \
    --flags startup-clear &
pids+=($!)
for _ in $(seq 50); do [ -S "$work/tpm.sock" ] && break; sleep 0.1; done

started=$(date +%s)
qemu-system-x86_64 -machine q35 -accel tcg -cpu qemu64 -smp 2 -m 3072 \
    -drive if=pflash,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd \
    -drive if=pflash,format=raw,file="$work/vars.fd" \
    -drive if=virtio,format=qcow2,file="$work/disk.qcow2" \
    -chardev socket,id=chrtpm,path="$work/tpm.sock" -tpmdev emulator,id=tpm0,chardev=chrtpm \
    -device tpm-tis,tpmdev=tpm0 \
    -netdev user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:"$port"-:8443 \
    -device virtio-net-pci,netdev=net0 \
    -display none -serial file:"$serial" -monitor none &
pids+=($!)

wait_for() { # PATTERN: wait until the serial log shows it
    while ! grep -q -a -- "$1" "$serial" 2>/dev/null; do
        kill -0 "${pids[1]}" 2>/dev/null || fail "qemu exited while waiting for '$1'"
        [ $(($(date +%s) - started)) -lt "$timeout_s" ] || fail "no '$1' within ${timeout_s}s"
        sleep 2
    done
}
wait_for "inferno-report: data-mount="
wait_for "inferno 0.1.0 ready"
echo "booted and ready in $(($(date +%s) - started))s"

report() { grep -a "inferno-report: $1=" "$serial" | tail -1 | sed "s/.*inferno-report: $1=//"; }
[ "$(report cmdline-roothash | tr -d '\r')" = 1 ] || fail "no roothash= on the command line"
report root-mount | grep -q '^/dev/mapper/root / erofs ro[,\ ]' || fail "root is not a read-only erofs on /dev/mapper/root: $(report root-mount)"
report verity | grep -q ' verity ' || fail "/dev/mapper/root is not dm-verity: $(report verity)"
report data-mount | grep -q '^/dev/mapper/inferno-data /var/lib/inferno ext4 rw' || fail "data partition not mounted: $(report data-mount)"
report data-luks | grep -qE '[0-9]+ +tpm2' || fail "data partition has no TPM2 token: $(report data-luks)"
# PCR 11 as measured at boot must be one of the values computed from the UKI (the phase the
# report runs in: sysinit or ready).
expected=$("$here/scripts/image-reference-values.sh" "$images" inferno-development |
    sed -n 's/^\(sysinit\|ready\) = "\(.*\)"$/\2/p')
pcr11=$(report pcr11 | tr -d '\r' | tr 'A-F' 'a-f')
grep -qx "$pcr11" <<<"$expected" || fail "PCR 11 $pcr11 is none of the computed values: $expected"
echo "PCR 11 matches the reference value computed from the UKI: $pcr11"

curl_api() { curl -sS -k --max-time 300 -H "Authorization: Bearer $key" "$@"; }
health=$(curl_api -o /dev/null -w '%{http_code}' "https://127.0.0.1:$port/health") || fail "/health unreachable"
[ "$health" = 200 ] || fail "/health answered $health"
model=$(curl_api "https://127.0.0.1:$port/v1/models" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
[ -n "$model" ] || fail "/v1/models named no model"
reply=$(curl_api "https://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"$model\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":8,\"temperature\":0}") \
    || fail "chat completion failed"
echo "$reply" | grep -q '"finish_reason"' || fail "chat completion answered: $reply"
echo "chat completion: $reply"

# What a client does before it sends a prompt: verify the server over this very TLS connection
# (certificate evidence plus fresh, channel-bound evidence) under the development client policy.
"$inferno" verify "https://127.0.0.1:$port" --policy "$here/policy/client-development.toml" \
    >"$work/verify.txt" 2>&1 || fail "inferno verify rejected the server: $(cat "$work/verify.txt")"
grep -a '^verdict: TRUSTED' "$work/verify.txt" || fail "inferno verify: $(cat "$work/verify.txt")"
grep -a '\[pass\] fresh.challenge' "$work/verify.txt" || fail "no fresh.challenge check: $(cat "$work/verify.txt")"

# The server's start-up evidence (simulated SNP plus the swtpm's quote of PCRs 0-7 and 11),
# appraised on the host with the image's development-smoke policy and the reference values
# computed from this image: PCR 11 as quoted must be the listed value, and another value fails.
curl -sS -k --max-time 60 "https://127.0.0.1:$port/v1/attestation" | jq '.evidence' \
    >"$work/evidence.json" || fail "GET /v1/attestation failed"
for case in listed other; do
    mkdir -p "$work/$case"
    { echo 'reference_values = "reference-values.toml"'
      sed -e 's/^pcrs = \[0, 1, 2, 3, 4, 5, 6, 7\]$/pcrs = [0, 1, 2, 3, 4, 5, 6, 7, 11]/' \
        "$here/policy/development.toml"; } >"$work/$case/policy.toml"
    # Without the [sev_snp] and [tdx] tables: the simulated TEE's launch measurement is not the
    # image's (and they are empty, not computed).
    "$here/scripts/image-reference-values.sh" "$images" inferno-development |
        awk '/^\[/ { skip = ($0 == "[sev_snp]" || $0 == "[tdx]") } !skip' \
            >"$work/$case/reference-values.toml"
done
sed -i "s/^11 = .*/11 = [\"$(printf '%064d' 0)\"]/" "$work/other/reference-values.toml"
"$inferno" attest verify --policy "$work/listed/policy.toml" "$work/evidence.json" \
    >"$work/listed/appraisal.txt" ||
    fail "the server's evidence fails the image's reference values: $(grep -a FAIL "$work/listed/appraisal.txt")"
grep -a "\[pass\] tpm.pcr_values: PCR 11 = $pcr11 is in the reference values" \
    "$work/listed/appraisal.txt" ||
    fail "the appraisal did not check PCR 11: $(cat "$work/listed/appraisal.txt")"
if "$inferno" attest verify --policy "$work/other/policy.toml" "$work/evidence.json" \
    >"$work/other/appraisal.txt"; then
    fail "evidence passed reference values with another PCR 11"
fi
grep -a "FAIL\] tpm.pcr_values: PCR 11 = $pcr11 is not in the reference values" \
    "$work/other/appraisal.txt" || fail "the rejection does not name PCR 11: $(grep -a FAIL "$work/other/appraisal.txt")"
echo "PASS in $(($(date +%s) - started))s"
