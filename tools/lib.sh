# shellcheck shell=bash
# Shell functions shared by tools/ and bench/ scripts; source it, don't run it.

# kvs_apt_need WHO PKG...: installs the Debian packages of the list that are not installed yet
# (with sudo unless root), saying so on stderr as "WHO: installing ..."; nothing when all are.
kvs_apt_need() {
    local who=$1 p
    shift
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    echo "$who: installing ${missing[*]}" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
}
