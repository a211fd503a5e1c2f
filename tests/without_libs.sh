#!/usr/bin/env bash
# Run a command on this machine as if some shared libraries were not installed.
#
#   tests/without_libs.sh 'libEGL*' 'libGL*' 'libOpenGL*' -- pytest tests -ra
#
# The command runs in a private mount namespace (unshare --mount; as root, or through a user
# namespace where the kernel allows one). There, every library folder that holds a file matching
# one of the patterns is replaced by a folder of links to everything else it holds, and the
# loader's cache (/etc/ld.so.cache, which ctypes.util.find_library reads through ldconfig -p) is
# rebuilt from what is left. The files are absent for every dlopen, ldconfig -p and ls inside the
# namespace; nothing changes outside it. Exits 2 with one line when the namespace cannot be made.
set -euo pipefail

patterns=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do patterns+=("$1"); shift; done
if [ $# -lt 2 ] || [ ${#patterns[@]} -eq 0 ]; then
  echo "usage: $0 PATTERN... -- COMMAND [ARGS...]" >&2
  exit 2
fi
shift

if [ "${_WITHOUT_LIBS_INSIDE:-}" != "1" ]; then
  command -v unshare >/dev/null || { echo "$0: needs unshare (util-linux)" >&2; exit 2; }
  if [ "$(id -u)" = 0 ]; then
    namespace=(unshare --mount --propagation private)
  else
    namespace=(unshare --map-root-user --mount --propagation private)
  fi
  if ! "${namespace[@]}" true 2>/dev/null; then
    echo "$0: needs a private mount namespace (${namespace[*]}): run as root, or allow user namespaces" >&2
    exit 2
  fi
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/without-libs.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  status=0
  _WITHOUT_LIBS_INSIDE=1 _WITHOUT_LIBS_SCRATCH=$scratch "${namespace[@]}" "$0" "${patterns[@]}" -- "$@" || status=$?
  exit "$status"
fi

# Inside the namespace.
scratch=$_WITHOUT_LIBS_SCRATCH
unset _WITHOUT_LIBS_INSIDE _WITHOUT_LIBS_SCRATCH

matches() {
  local name=$1 pattern
  for pattern in "${patterns[@]}"; do
    # shellcheck disable=SC2053  # the pattern is a glob on purpose
    [[ $name == $pattern ]] && return 0
  done
  return 1
}

# ldconfig lives in /sbin, which a user's PATH may lack.
ldconfig=$(PATH="$PATH:/sbin:/usr/sbin" command -v ldconfig) || {
  echo "$0: needs ldconfig (libc-bin) to find the loader's folders" >&2; exit 2; }
# The folders the loader searches: those in its cache, and the standard ones (multiarch too).
mapfile -t folders < <({ "$ldconfig" -p | sed -n 's/.* => \(.*\)\/[^/]*$/\1/p'
                         printf '%s\n' /lib /usr/lib /lib64 /usr/lib64 /usr/local/lib
                         arch=$(uname -m)-linux-gnu; printf '%s\n' "/lib/$arch" "/usr/lib/$arch"; } | sort -u)
declare -A done_folders=()
hidden=()
count=0
for folder in "${folders[@]}"; do
  [ -d "$folder" ] || continue
  real=$(readlink -f "$folder")
  [ -n "${done_folders[$real]:-}" ] && continue
  done_folders[$real]=1
  found=0
  for path in "$real"/*; do
    matches "${path##*/}" && { found=1; hidden+=("$path"); }
  done
  [ "$found" = 1 ] || continue
  count=$((count + 1))
  original="$scratch/original$count" links="$scratch/links$count"
  mkdir -p "$original" "$links"
  mount --bind "$real" "$original"
  for path in "$original"/* "$original"/.[!.]*; do
    [ -e "$path" ] || [ -L "$path" ] || continue
    name=${path##*/}
    matches "$name" || ln -s "$path" "$links/$name"
  done
  mount --bind "$links" "$real"
done

if [ -f /etc/ld.so.cache ]; then
  "$ldconfig" -X -C "$scratch/ld.so.cache" 2>/dev/null || true
  [ -f "$scratch/ld.so.cache" ] && mount --bind "$scratch/ld.so.cache" /etc/ld.so.cache
fi
if [ ${#hidden[@]} -eq 0 ]; then
  # (a machine without them already: the command runs as it would there, which is the point)
  echo "without_libs: WARNING: no file in the loader's folders matches ${patterns[*]}: nothing hidden" >&2
else
  echo "without_libs: hidden ${#hidden[@]} files matching ${patterns[*]}" >&2
fi
exec "$@"
