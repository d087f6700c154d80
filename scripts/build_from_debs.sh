#!/usr/bin/env bash
# Builds Foundry on a system whose own packages lack some of its dependencies (Ubuntu 24.04
# has no oneDNN 2.x and may lack the xxHash headers): Debian 12's .deb files of them, fetched
# elsewhere with `apt-get download libdnnl-dev libdnnl2 libxxhash-dev`, are unpacked into a
# prefix inside the build directory and the build is pointed at it. The other dependencies
# must be installed (scripts/setup.sh lists them).
#   scripts/build_from_debs.sh DEB_DIR [build-dir=build] [extra cmake args...]
# Then run it with the prefix's libraries on the path: source BUILD/deps/env.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
debs="$(realpath "${1:?usage: scripts/build_from_debs.sh DEB_DIR [build-dir] [cmake args...]}")"
build="$(realpath -m "${2:-$root/build}")"
shift 2 || shift || true
ls "$debs"/*.deb >/dev/null 2>&1 || { echo "error: no .deb files in $debs" >&2; exit 1; }

prefix="$build/deps"
mkdir -p "$prefix"
for f in "$debs"/*.deb; do dpkg -x "$f" "$prefix"; done
lib="$prefix/usr/lib/x86_64-linux-gnu"
# The unpacked libxxhash.so points at a libxxhash.so.0.8.1 that only the runtime package has;
# use the system's own runtime library where there is one.
system_xxhash="$(ls /usr/lib/x86_64-linux-gnu/libxxhash.so.0* 2>/dev/null | head -n1 || true)"
[ -n "$system_xxhash" ] && ln -sf "$system_xxhash" "$lib/libxxhash.so"
for pc in "$lib"/pkgconfig/*.pc; do sed -i "s|^prefix=.*|prefix=$prefix/usr|" "$pc"; done

cat > "$prefix/env.sh" <<ENV
export CMAKE_PREFIX_PATH="$prefix/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
export PKG_CONFIG_PATH="$lib/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
export CPATH="$prefix/usr/include\${CPATH:+:\$CPATH}"
export LIBRARY_PATH="$lib\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
ENV
# shellcheck disable=SC1091
source "$prefix/env.sh"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
mkdir -p "$build"
cmake "${generator[@]}" -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" >"$build/configure.log" ||
  { cat "$build/configure.log" >&2; exit 1; }
grep "^-- Foundry" "$build/configure.log" >&2 || true
echo "build_from_debs: building in $build ($(c++ --version | head -n1))" >&2
# FOUNDRY_BUILD_TARGETS (optional): build only these targets, e.g. "foundry test_cuda".
# shellcheck disable=SC2086
cmake --build "$build" -j"$(nproc)" ${FOUNDRY_BUILD_TARGETS:+--target $FOUNDRY_BUILD_TARGETS} \
  >"$build/build.log" 2>&1 || {
  grep -E 'error|Error' "$build/build.log" | head -40 >&2
  echo "build_from_debs: build failed (full log: $build/build.log)" >&2
  exit 1
}
