#!/usr/bin/env bash
# scripts/image-smoke.sh [IMAGE_DIR]: boot the development variant of the appliance image under
# qemu-system-x86_64 with TCG (no KVM, -cpu qemu64) and check that it serves.
#
# IMAGE_DIR holds inferno-development.qcow2 (default image/out-dev; build it with
#   IMAGE_PROFILE=development image/build image/out-dev).
# Needs qemu-system-x86, ovmf, swtpm and curl. Checks, each under a timeout:
#   - the serial console shows the server's "ready" banner;
#   - the root is erofs, mounted read-only, from /dev/mapper/root, whose table is dm-verity, and
#     the command line carries roothash=;
#   - the data partition was created on first boot, LUKS-encrypted with a key sealed to the
#     (software) TPM, and is mounted on /var/lib/inferno;
#   - PCR 11 of the (software) vTPM equals the value computed from the UKI's sections;
#   - GET /health answers 200 and a chat completion answers, through a forwarded port.
# Prints PASS or the failing check, and leaves the serial log in $SMOKE_WORK (default: a temp dir).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
images=$(realpath "${1:-$here/image/out-dev}")
timeout_s=${SMOKE_TIMEOUT:-900}
port=${SMOKE_PORT:-18443}
key=inferno-smoke-test-key
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
echo "PASS in $(($(date +%s) - started))s"
