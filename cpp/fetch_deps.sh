#!/usr/bin/env bash
# Fetch what the C++ build needs, without touching the system's apt sources. Idempotent.
#
#   cpp/third_party/onnxruntime/include   ONNX Runtime C/C++ API headers, from Debian trixie's libonnxruntime-dev
#   cpp/third_party/onnxruntime/lib       libonnxruntime.so.<version> from the onnxruntime Python wheel, + symlinks;
#                                         from onnxruntime-gpu also its provider libraries (providers_shared,
#                                         providers_cuda, providers_tensorrt), which ONNX Runtime loads from the
#                                         directory libonnxruntime.so is in: without them `provider "cuda"` fails
#   system packages (bookworm)            libsentencepiece-dev nlohmann-json3-dev doctest-dev libssl-dev
#
# The headers' C API version (21 for 1.21) is older than the library's; ONNX Runtime's C API is append-only and
# a newer library serves older API versions, so these headers work with the wheel's newer library. The binary
# links against the wheel's library itself (its symbols are versioned VERS_<release>), so it runs only with
# that release: re-run this script after upgrading onnxruntime. Environment:
#   PYTHON            the Python whose onnxruntime wheel provides the library (default: ../.venv/bin/python);
#                     for the C++ cuda provider, one with onnxruntime-gpu installed
#   ORT_OUT           where headers and library go (default cpp/third_party/onnxruntime; CMake's
#                     -DONNXRUNTIME_ROOT takes another)
#   ORT_DEB_SUITE     Debian suite for the headers (default trixie), ORT_DEB_VERSION (default: that suite's)
#   DEBIAN_MIRROR     the archive to fetch them from (default: the machine's own Debian mirror)
#   SKIP_APT_INSTALL  set to 1 to not apt-get install the system packages (then they must be present)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${ORT_OUT:-$HERE/third_party/onnxruntime}"
PYTHON="${PYTHON:-$HERE/../.venv/bin/python}"
SUITE="${ORT_DEB_SUITE:-trixie}"
WORK="$HERE/third_party/.apt"

# 1. System packages from the machine's own (bookworm) sources.
PKGS=(libsentencepiece-dev nlohmann-json3-dev doctest-dev libssl-dev)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "${SKIP_APT_INSTALL:-0}" = 1 ]; then echo "fetch_deps: missing packages: ${missing[*]}" >&2; exit 1; fi
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "fetch_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# 2. ONNX Runtime headers from Debian's libonnxruntime-dev, through a private sources list and state dir.
if [ ! -f "$OUT/include/onnxruntime_cxx_api.h" ]; then
  mkdir -p "$WORK/lists/partial" "$WORK/cache/archives/partial" "$WORK/deb"
  # The same Debian mirror the machine already uses (its first main archive URI), asked for another suite.
  mirror="${DEBIAN_MIRROR:-$(apt-get indextargets --format '$(REPO_URI)' 'Created-By: Packages' 2>/dev/null \
    | grep -v -- '-security' | head -1)}"
  mirror="${mirror%/}"
  [ -n "$mirror" ] || { echo "fetch_deps: no Debian mirror in the apt sources; set DEBIAN_MIRROR" >&2; exit 1; }
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $SUITE main" > "$WORK/sources.list"
  APT=(-o Dir::Etc::SourceList="$WORK/sources.list" -o Dir::Etc::SourceParts=/dev/null
       -o Dir::State::Lists="$WORK/lists" -o Dir::Cache="$WORK/cache" -o Dir::State::Status=/dev/null
       -o APT::Sandbox::User=root -o Debug::NoLocking=1)
  echo "fetch_deps: libonnxruntime-dev from Debian $SUITE"
  apt-get "${APT[@]}" update -qq
  version="${ORT_DEB_VERSION:-$(apt-cache "${APT[@]}" show libonnxruntime-dev | sed -n 's/^Version: //p' | head -1)}"
  [ -n "$version" ] || { echo "fetch_deps: Debian $SUITE has no libonnxruntime-dev" >&2; exit 1; }
  (cd "$WORK/deb" && rm -f ./*.deb && apt-get "${APT[@]}" download -qq "libonnxruntime-dev=$version")
  rm -rf "$WORK/x" && dpkg -x "$WORK"/deb/libonnxruntime-dev_*.deb "$WORK/x"
  mkdir -p "$OUT/include"
  cp -r "$WORK"/x/usr/include/onnxruntime/. "$OUT/include/"
  echo "$version" > "$OUT/include/DEBIAN_VERSION"
  rm -rf "$WORK"
fi

# 3. The shared library from the onnxruntime Python wheel.
[ -x "$PYTHON" ] || PYTHON=python3
capi="$("$PYTHON" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))')" \
  || { echo "fetch_deps: $PYTHON cannot import onnxruntime (pip install onnxruntime)" >&2; exit 1; }
so="$(cd "$capi" && ls libonnxruntime.so.1.* | head -1)"
[ -n "$so" ] || { echo "fetch_deps: no libonnxruntime.so.1.* in $capi" >&2; exit 1; }
mkdir -p "$OUT/lib"
if ! cmp -s "$capi/$so" "$OUT/lib/$so"; then
  rm -f "$OUT"/lib/libonnxruntime.so*
  cp "$capi/$so" "$OUT/lib/$so"
fi
ln -sfn "$so" "$OUT/lib/libonnxruntime.so.1"
ln -sfn libonnxruntime.so.1 "$OUT/lib/libonnxruntime.so"
# Provider libraries: whatever this wheel ships (onnxruntime-gpu: shared, cuda, tensorrt; the CPU wheel none),
# and none left over from an earlier wheel.
providers=()
for lib in "$capi"/libonnxruntime_providers_*.so; do [ -e "$lib" ] && providers+=("$(basename "$lib")"); done
for lib in "$OUT"/lib/libonnxruntime_providers_*.so; do
  [ -e "$lib" ] && [[ " ${providers[*]} " != *" $(basename "$lib") "* ]] && rm -f "$lib"
done
for lib in "${providers[@]}"; do cmp -s "$capi/$lib" "$OUT/lib/$lib" || cp "$capi/$lib" "$OUT/lib/$lib"; done
echo "fetch_deps: ONNX Runtime headers $(cat "$OUT/include/DEBIAN_VERSION") (Debian $SUITE), library $so" \
  "${providers[@]:+(providers: ${providers[*]})} -> $OUT"
