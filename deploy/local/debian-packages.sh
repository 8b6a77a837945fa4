# Sourced by the build scripts that need Debian's packages: `ensure_debian_packages
# <caller> <command>=<package>...` installs the packages whose command is missing (a
# command is found on PATH or in /usr/sbin, /sbin; `java` must also run), one install
# at a time on the machine. On a fresh machine the two test workers' image builds, the
# node build and the Temporal test server's may all ask at once, and a second apt-get
# fails at once on dpkg's lock (exit 100): each waits for Kama's lock, then for dpkg's.
# Not root or not Debian: it says which packages to install and fails.

_debian_command_present() {
  local tool="$1"
  if [[ "$tool" == java ]]; then
    command -v java >/dev/null 2>&1 && java -version >/dev/null 2>&1
    return
  fi
  command -v "$tool" >/dev/null 2>&1 || [[ -x "/usr/sbin/$tool" || -x "/sbin/$tool" ]]
}

_debian_missing() {  # the packages of the pairs whose command is missing, one per line
  local pair
  for pair in "$@"; do
    _debian_command_present "${pair%%=*}" || printf '%s\n' "${pair#*=}"
  done | sort -u
}

ensure_debian_packages() {
  local caller="$1"; shift
  local missing
  mapfile -t missing < <(_debian_missing "$@")
  ((${#missing[@]})) || return 0
  if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null; then
    printf '%s: need %s (Debian: apt-get install -y %s)\n' "$caller" "${missing[*]}" "${missing[*]}" >&2
    return 1
  fi
  (
    flock 8
    mapfile -t missing < <(_debian_missing "$@")  # another caller may have installed them
    ((${#missing[@]})) || exit 0
    printf '[%s %s] installing %s from Debian\n' "$caller" "$(date +%H:%M:%S)" "${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}"
  ) 8>/var/lock/kama-debian-packages.lock >&2
}
