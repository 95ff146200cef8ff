#!/usr/bin/env bash
# Generates the simulated TEE's test hierarchy: ARK -> ASK (RSA-4096, RSASSA-PSS/SHA-384,
# salt 48, as AMD's) -> VCEK (ECDSA P-384) with the AMD VCEK extensions, ARK -> ASVK -> VLEK
# (same extensions, a CSP name instead of a hwID), plus a VCEK whose
# validity ended in 2021 for negative tests, and CRLs signed by the ARK. Test keys only: they
# are committed on purpose and trusted solely by policies that name the ARK fingerprint
# (policy/development.toml). The ARK and ASK private keys are deleted after use.
# Usage: attestation/testdata/sim/generate.sh   (rewrites the files beside this script)
set -euo pipefail
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# CHIP_ID of the simulated chip: SHA-512 of a fixed label.
chip_id=$(printf 'inferno simulated chip' | openssl dgst -sha512 -r | cut -d' ' -f1)
printf '%s\n' "$chip_id" > chip_id.hex

cat > "$work/ca.cnf" <<CNF
[ca]
default_ca = sim
[sim]
dir = $work
database = $work/index.txt
new_certs_dir = $work
serial = $work/serial
policy = any
unique_subject = no
default_md = sha384
copy_extensions = none
[any]
commonName = supplied
organizationName = optional
[ark_ext]
basicConstraints = critical,CA:true
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[ask_ext]
basicConstraints = critical,CA:true,pathlen:0
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[vlek_ext]
1.3.6.1.4.1.3704.1.1 = ASN1:INTEGER:1
1.3.6.1.4.1.3704.1.2 = ASN1:IA5STRING:Milan-B0
1.3.6.1.4.1.3704.1.3.1 = ASN1:INTEGER:3
1.3.6.1.4.1.3704.1.3.2 = ASN1:INTEGER:0
1.3.6.1.4.1.3704.1.3.3 = ASN1:INTEGER:8
1.3.6.1.4.1.3704.1.3.8 = ASN1:INTEGER:115
1.3.6.1.4.1.3704.1.5 = ASN1:IA5STRING:Inferno test CSP
[vcek_ext]
1.3.6.1.4.1.3704.1.1 = ASN1:INTEGER:1
1.3.6.1.4.1.3704.1.2 = ASN1:IA5STRING:Milan-B0
1.3.6.1.4.1.3704.1.3.1 = ASN1:INTEGER:3
1.3.6.1.4.1.3704.1.3.2 = ASN1:INTEGER:0
1.3.6.1.4.1.3704.1.3.3 = ASN1:INTEGER:8
1.3.6.1.4.1.3704.1.3.8 = ASN1:INTEGER:115
1.3.6.1.4.1.3704.1.4 = DER:$chip_id
CNF
: > "$work/index.txt"
echo 01 > "$work/serial"
pss=(-md sha384 -sigopt rsa_padding_mode:pss -sigopt rsa_pss_saltlen:48 -sigopt rsa_mgf1_md:sha384)

openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:4096 -out ark.key.pem 2>/dev/null
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:4096 -out ask.key.pem 2>/dev/null
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:4096 -out asvk.key.pem 2>/dev/null
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-384 -out vcek.key.pem
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-384 -out vlek.key.pem

openssl req -new -key ark.key.pem -subj "/O=Inferno test/CN=SIMULATED-ARK" -out "$work/ark.csr"
openssl ca -batch -config "$work/ca.cnf" -selfsign -keyfile ark.key.pem -in "$work/ark.csr" \
  -extensions ark_ext -startdate 20250101000000Z -enddate 20500101000000Z "${pss[@]}" \
  -notext -out "$work/ark.pem" 2>/dev/null
openssl req -new -key ask.key.pem -subj "/O=Inferno test/CN=SIMULATED-ASK" -out "$work/ask.csr"
openssl ca -batch -config "$work/ca.cnf" -cert "$work/ark.pem" -keyfile ark.key.pem -in "$work/ask.csr" \
  -extensions ask_ext -startdate 20250101000000Z -enddate 20500101000000Z "${pss[@]}" \
  -notext -out "$work/ask.pem" 2>/dev/null
openssl req -new -key vcek.key.pem -subj "/O=Inferno test/CN=SIMULATED-VCEK" -out "$work/vcek.csr"
openssl ca -batch -config "$work/ca.cnf" -cert "$work/ask.pem" -keyfile ask.key.pem -in "$work/vcek.csr" \
  -extensions vcek_ext -startdate 20250101000000Z -enddate 20500101000000Z "${pss[@]}" \
  -notext -out "$work/vcek.pem" 2>/dev/null
openssl ca -batch -config "$work/ca.cnf" -cert "$work/ask.pem" -keyfile ask.key.pem -in "$work/vcek.csr" \
  -extensions vcek_ext -startdate 20200101000000Z -enddate 20210101000000Z "${pss[@]}" \
  -notext -out "$work/vcek-expired.pem" 2>/dev/null

openssl req -new -key asvk.key.pem -subj "/O=Inferno test/CN=SIMULATED-ASVK" -out "$work/asvk.csr"
openssl ca -batch -config "$work/ca.cnf" -cert "$work/ark.pem" -keyfile ark.key.pem -in "$work/asvk.csr" \
  -extensions ask_ext -startdate 20250101000000Z -enddate 20500101000000Z "${pss[@]}" \
  -notext -out "$work/asvk.pem" 2>/dev/null
openssl req -new -key vlek.key.pem -subj "/O=Inferno test/CN=SIMULATED-VLEK" -out "$work/vlek.csr"
openssl ca -batch -config "$work/ca.cnf" -cert "$work/asvk.pem" -keyfile asvk.key.pem -in "$work/vlek.csr" \
  -extensions vlek_ext -startdate 20250101000000Z -enddate 20500101000000Z "${pss[@]}" \
  -notext -out "$work/vlek.pem" 2>/dev/null

# CRLs issued by the ARK (AMD's CRLs list revoked ASKs/ASVKs): a current empty one, a stale one
# (next update 2025-06-01) and a current one that revokes the ASK.
crl() {
  openssl ca -batch -config "$work/ca.cnf" -gencrl -cert "$work/ark.pem" -keyfile ark.key.pem \
    -crl_lastupdate "$1" -crl_nextupdate "$2" "${pss[@]}" -out "$work/crl.pem" 2>/dev/null
  openssl crl -in "$work/crl.pem" -outform DER -out "$3"
}
crl 20250101000000Z 20500101000000Z ark.crl.der
crl 20250101000000Z 20250601000000Z ark-stale.crl.der
openssl ca -batch -config "$work/ca.cnf" -cert "$work/ark.pem" -keyfile ark.key.pem \
  -revoke "$work/ask.pem" 2>/dev/null
crl 20250101000000Z 20500101000000Z ark-revokes-ask.crl.der

for name in ark ask asvk vcek vcek-expired vlek; do
  openssl x509 -in "$work/$name.pem" -outform DER -out "$name.der"
done
rm ark.key.pem ask.key.pem asvk.key.pem
openssl dgst -sha256 -r ark.der | cut -d' ' -f1 > ark.sha256
echo "simulated ARK fingerprint: $(cat ark.sha256)"
