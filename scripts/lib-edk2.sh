# Shared by scripts/ovmf-amdsev-build.sh and scripts/tdvf-build.sh (source it, do not run it):
# Debian trixie's edk2 source package, unpacked with Debian's patches, and the edk2 build.
# The recipe each firmware's SHA-256 depends on is described in those scripts.

edk2_version=2025.02
edk2_debian_revision=8+deb13u1
edk2_orig_sha256=b63b6053d6d89c74d9291f9e96fde1584be99e6fb9c169ba9511505129d6b049
edk2_debian_sha256=e2a7f6fc58640818416a028d6d5e9dfc255697a7cdc60c14566c236df6bd9b08

# edk2_prepare NAME WORK: checks the build tools, fetches (apt-get source) and checks both
# tarballs in WORK, unpacks them with Debian's patches applied (once), and cds into the source.
# NAME prefixes the error messages.
edk2_prepare() {
    local name=$1 work=$2 tool
    for tool in gcc make nasm iasl python3 patch sha256sum nice; do
        command -v "$tool" >/dev/null || {
            echo "$name: $tool is missing (apt-get install build-essential nasm acpica-tools uuid-dev python3)" >&2
            exit 1
        }
    done
    mkdir -p "$work"
    cd "$work"
    local orig=edk2_$edk2_version.orig.tar.xz
    local debian=edk2_$edk2_version-$edk2_debian_revision.debian.tar.xz
    if [ ! -f "$orig" ] || [ ! -f "$debian" ]; then
        # The .dsc is not needed: both tarballs are checked against the hashes above.
        apt-get source --download-only "edk2=$edk2_version-$edk2_debian_revision" >&2 || true
    fi
    local file hash
    for file in "$orig:$edk2_orig_sha256" "$debian:$edk2_debian_sha256"; do
        hash=${file#*:}
        file=${file%%:*}
        [ -f "$file" ] || { echo "$name: $work/$file is missing (add a trixie deb-src entry, or download it from the Debian archive)" >&2; exit 1; }
        [ "$(sha256sum "$file" | cut -d' ' -f1)" = "$hash" ] || { echo "$name: $file does not have SHA-256 $hash" >&2; exit 1; }
    done
    local src=$work/edk2-$edk2_version p
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
}

# edk2_build DSC: builds BaseTools, then DSC (X64, GCC5, RELEASE) from scratch, in the source
# directory edk2_prepare left us in.
edk2_build() {
    local dsc=$1
    export PYTHON_COMMAND=python3
    # edksetup.sh reads the positional parameters: give it none.
    set +u --
    # shellcheck disable=SC1091
    . ./edksetup.sh >&2
    set -u
    nice -n 10 make -C BaseTools -j"$(nproc)" >&2
    rm -rf Build
    nice -n 10 build -a X64 -t GCC5 -b RELEASE -n "$(nproc)" -p "$dsc" >&2
}

# edk2_finish BUILT OUT DESCRIPTION: copies the built firmware BUILT to OUT, writes
# OUT.build-info (DESCRIPTION and the toolchain's versions) and prints OUT and its SHA-256.
edk2_finish() {
    cp "$1" "$2"
    {
        echo "edk2 $edk2_version-$edk2_debian_revision (Debian trixie source), $3"
        gcc --version | head -1
        nasm -v
        iasl -v 2>/dev/null | sed -n 's/.*Compiler.*version/iasl version/p' | head -1
    } >"$2.build-info"
    echo "$2 $(sha256sum "$2" | cut -d' ' -f1)"
}
