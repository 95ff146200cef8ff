#!/usr/bin/env bash
# Regenerates audit/testdata/interop/vectors.json with Go's golang.org/x/mod/sumdb (tlog and note)
# from Debian's packages (apt-get install golang-go golang-golang-x-mod-dev): no network, no modules.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=$ROOT/audit/testdata/interop
cd "$DIR"
GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=${GOCACHE:-/tmp/inferno-go-cache} go run gen.go >"$DIR/vectors.json.tmp"
mv "$DIR/vectors.json.tmp" "$DIR/vectors.json"
echo "wrote $DIR/vectors.json ($(go version))"
