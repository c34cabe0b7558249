#!/bin/bash
# Fetches CPython 3.14 and 3.15 (and 3.14's debug build) from Debian's
# unstable suite into a cache folder, for the test matrix
# (tests/integration/pythons.py finds them there). Idempotent: once the
# folder is complete it does nothing; run it again after deleting the
# folder, or with --refresh, to take the suite's current versions.
#
# Never touches the system's apt configuration or state: the sources file,
# the package lists and apt's cache are private to the cache folder
# (Dir::Etc::sourcelist, Dir::Etc::sourceparts=-, Dir::State::Lists,
# Dir::Cache), and nothing is installed: the packages are unpacked with
# dpkg-deb -x into one folder, with their own C library (unstable's glibc
# is newer than this system's, which it cannot replace). patchelf then
# points each executable at that C library's loader, with an rpath to the
# folder's libraries, so that it runs as an ordinary program.
#
# Where: $SPYRESHIM_PYTHONS_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/spyreshim/pythons;
# the interpreters are under <that>/debian-unstable/root/usr/bin. The
# loader path written into the executables is absolute: a moved folder is
# patched again on the next run.
set -euo pipefail

cache=${SPYRESHIM_PYTHONS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spyreshim/pythons}
dist=$cache/debian-unstable
refresh=0
case "${1:-}" in
  --refresh) refresh=1 ;;
  "") ;;
  *) echo "usage: $0 [--refresh]" >&2; exit 2 ;;
esac

versions=(3.14 3.15)
pkgs=()
for v in "${versions[@]}"; do
  pkgs+=("python$v" "python$v-minimal" "libpython$v" "libpython$v-minimal" "libpython$v-stdlib"
         "libpython$v-dev" "python$v-dev")
done
pkgs+=(python3.14-dbg libpython3.14-dbg)
# The C library they are built against and what the standard library's
# extension modules link to.
pkgs+=(libc6 libexpat1 zlib1g libffi8 libssl3t64 libbz2-1.0 liblzma5 libzstd1 libsqlite3-0
       libuuid1 libncursesw6 libtinfo6 libreadline8t64 libdb5.3t64 libgcc-s1)

root=$dist/root
loader=$root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
stamp=$dist/done
want="packages: ${pkgs[*]}
root: $root"

for tool in apt-get dpkg-deb patchelf flock; do
  command -v "$tool" >/dev/null || { echo "pythons: $tool is missing (scripts/deps.sh installs it)" >&2; exit 1; }
done

mkdir -p "$dist"
exec 9>"$dist/.lock"
flock 9                        # parallel runs (several worktrees) fetch once

if ((!refresh)) && [ -f "$stamp" ] && [ "$(sed -n '1,2p' "$stamp")" = "$want" ]; then
  exit 0
fi

# Executables to patch: (name in usr/bin) for every version; the debug build
# is python3.14d (Debian's name; python3.14-dbg is a link to it).
patch_all() {
  local exe
  for exe in "$root"/usr/bin/python3.1[45] "$root"/usr/bin/python3.14d; do
    [ -L "$exe" ] && continue
    [ -f "$exe" ] || { echo "pythons: $exe missing after unpacking" >&2; exit 1; }
    patchelf --set-interpreter "$loader" --force-rpath \
      --set-rpath '$ORIGIN/../lib/x86_64-linux-gnu' "$exe"
  done
}

# Only the patch is stale (the folder moved, or a run was interrupted after
# unpacking): no download.
if ((!refresh)) && [ -f "$dist/unpacked" ] && [ "$(cat "$dist/unpacked")" = "packages: ${pkgs[*]}" ]; then
  patch_all
  printf '%s\n' "$want" "$(cat "$dist/versions")" >"$stamp"
  exit 0
fi

apt_state=$dist/apt
mkdir -p "$apt_state/lists/partial" "$apt_state/cache/archives/partial" "$dist/debs"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian unstable main" \
  >"$apt_state/sources.list"
apt_opts=(
  -o "Dir::Etc::sourcelist=$apt_state/sources.list"
  -o "Dir::Etc::sourceparts=-"
  -o "Dir::State::Lists=$apt_state/lists"
  -o "Dir::Cache=$apt_state/cache"
  -o "APT::Architecture=amd64"
  -o "APT::Architectures=amd64"
  -o "Acquire::Languages=none"
  -o "APT::Sandbox::User=root"
)
echo "pythons: fetching ${#pkgs[@]} packages from Debian unstable into $dist (about 130 MB, once)" >&2
apt-get -qq "${apt_opts[@]}" update >/dev/null || { echo "pythons: apt-get update of the unstable suite failed" >&2; exit 1; }
rm -f "$dist"/debs/*.deb
(cd "$dist/debs" && apt-get -qq "${apt_opts[@]}" download "${pkgs[@]}" >/dev/null) ||
  { echo "pythons: apt-get download failed" >&2; exit 1; }

rm -rf "$root.new"
mkdir -p "$root.new"
for deb in "$dist"/debs/*.deb; do
  dpkg-deb -x "$deb" "$root.new"
done
rm -rf "$root"
mv "$root.new" "$root"
for deb in "$dist"/debs/*.deb; do
  dpkg-deb -W --showformat='${Package} ${Version}\n' "$deb"
done >"$dist/versions"
echo "packages: ${pkgs[*]}" >"$dist/unpacked"
patch_all
# The .debs are not needed any more.
rm -f "$dist"/debs/*.deb
"$root/usr/bin/python3.14" -c 'import ssl, sqlite3, ctypes, lzma, bz2, zlib' ||
  { echo "pythons: the unpacked python3.14 does not run" >&2; exit 1; }
printf '%s\n' "$want" "$(cat "$dist/versions")" >"$stamp"
echo "pythons: ready: $(ls "$root"/usr/bin/python3.1[45] "$root"/usr/bin/python3.14d | tr '\n' ' ')" >&2
