# Sourced by the project scripts that fetch Debian source packages or run debootstrap.
# The mirror is read from this machine's own apt configuration so that no registry host
# is written into the repository.

# Prints the URI of the first Debian archive entry (deb822 or one-line format).
debian_mirror() {
    local uri=""
    if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
        uri=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources)
    fi
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; exit}}' \
            /etc/apt/sources.list)
    fi
    if [ -z "$uri" ]; then
        echo "no Debian archive entry found in /etc/apt/sources.list{,.d}" >&2
        return 1
    fi
    echo "${uri%/}"
}

# Installs Debian packages (as root) unless every one of them is already installed.
apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        echo "need root to install: ${missing[*]}" >&2
        return 1
    fi
    if [ -z "${RNIC_APT_UPDATED:-}" ]; then
        apt-get update -qq
        export RNIC_APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The cache for heavy artifacts (QEMU build, guest images), outside the work tree.
rnic_cache_dir() {
    echo "${RNIC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rnic-emu}"
}
