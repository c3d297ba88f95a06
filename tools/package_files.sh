#!/usr/bin/env bash
# Packs built LBCC files into (a) a Debian package and (b) a relocatable tarball, in OUT:
#   tools/package_files.sh [--out=DIR] LIBLBCC HEADER PLUGIN PYEXT PYPKG LBCC LBCC_PERF
#     LIBLBCC  liblbcc.so               PLUGIN  plugin/libnccl-net-lbcc.so
#     HEADER   comm/lbcc.h              PYEXT   python/lbcc/_lbcc.so   PYPKG  python/lbcc
#     LBCC, LBCC_PERF                   the tools/lbcc and bench/lbcc_perf binaries
# (tools/package builds them and calls this; tools:package_files_test calls it on Bazel's.)
#
# lbcc_VERSION_amd64.deb installs under /usr: lib/x86_64-linux-gnu/{liblbcc.so*,
# libnccl-net-lbcc.so, pkgconfig/lbcc.pc, cmake/lbcc/}, include/lbcc.h, bin/{lbcc,lbcc_perf},
# lib/python3/dist-packages/lbcc (the extension with its ABI tag). Depends: what
# dpkg-shlibdeps finds the shared objects need (libc6, libstdc++6, libopenblas0, ...; Abseil is
# inside each object), libucx0 (UCX is loaded at run time, by soname, into a namespace of its
# own: transport/ucx_api.h), python3 of the extension's minor version and python3-numpy.
# lbcc-VERSION-linux-x86_64.tar.gz unpacks to lbcc-VERSION/ with bin/, include/, lib/
# (pkgconfig/, cmake/lbcc/, python3/site-packages/lbcc) and, in lib/, every shared library the
# objects load except glibc, the C++ runtime and UCX (the machine's own, found by the dynamic
# linker's search path: a cluster's UCX is the one its network needs; LBCC's copy of it stays in
# its own namespace beside any other the process loads). Its RPATHs are relative ($ORIGIN), so
# it runs from any folder. Neither carries the UCX that tools/setup builds with tools/ucx/'s
# patches: an installed LBCC loads the machine's UCX and warns that it lacks them (a Debian 12
# libucx0 can abort an elastic member under churn: docs/elastic.md), unless LBCC_UCX_LIBRARY
# names a patched one.
set -euo pipefail
source "$(dirname "$0")/flags.sh"
flags_value out /tmp/lbcc_package "output folder"
flags_positional "LIBLBCC HEADER PLUGIN PYEXT PYPKG LBCC LBCC_PERF" "built files (see above)"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 7)) || { echo "package_files.sh: needs 7 files (see --help)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
liblbcc=${FLAGS_ARGS[0]} header=${FLAGS_ARGS[1]} plugin=${FLAGS_ARGS[2]} pyext=${FLAGS_ARGS[3]}
pypkg=${FLAGS_ARGS[4]} lbcc=${FLAGS_ARGS[5]} perf=${FLAGS_ARGS[6]}
version=0.1.0
python=${LBCC_PYTHON:-/usr/bin/python3}
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
out=$FLAG_out
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# (a) The .deb.
deb=$work/deb
multiarch=lib/x86_64-linux-gnu
"$here/install_files.sh" --libdir="$multiarch" --norpath "$liblbcc" "$header" "$deb/usr" >/dev/null
install -D -m 0755 "$plugin" "$deb/usr/$multiarch/libnccl-net-lbcc.so"
install -D -m 0755 "$lbcc" "$deb/usr/bin/lbcc"
install -D -m 0755 "$perf" "$deb/usr/bin/lbcc_perf"
LBCC_PYTHON=$python "$here/../python/install_files.sh" "$pypkg" "$pyext" \
  "$deb/usr/lib/python3/dist-packages" >/dev/null
# Bazel's outputs are read-only and unstripped: the package ships stripped, writable copies.
find "$deb" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec chmod u+w {} + \
  -exec strip --strip-unneeded {} +
objects=("$deb/usr/$multiarch/liblbcc.so.$version" "$deb/usr/$multiarch/libnccl-net-lbcc.so"
         "$deb/usr/bin/lbcc" "$deb/usr/bin/lbcc_perf" "$deb"/usr/lib/python3/dist-packages/lbcc/_lbcc*.so)
mkdir -p "$work/shlibs/debian"
printf 'Source: lbcc\n\nPackage: lbcc\nArchitecture: amd64\n' > "$work/shlibs/debian/control"
shlibs=$(cd "$work/shlibs" && dpkg-shlibdeps -O "${objects[@]/#/-e}" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[[ -n $shlibs ]] || { echo "package_files.sh: dpkg-shlibdeps found no dependencies" >&2; exit 1; }
next=$("$python" -c 'import sys; print("%d.%d" % (sys.version_info[0], sys.version_info[1] + 1))')
mkdir -p "$deb/DEBIAN" "$deb/usr/share/doc/lbcc"
cat > "$deb/DEBIAN/control" <<CONTROL
Package: lbcc
Version: $version
Architecture: amd64
Maintainer: LBCC developers <lbcc@localhost>
Section: libs
Priority: optional
Depends: $shlibs, libucx0 (>= 1.13), python3 (>= $pyver), python3 (<< $next), python3-numpy
Recommends: python3-torch
Description: Low-Bandwidth Collective Communication
 LBCC's C API (liblbcc.so, lbcc.h, pkg-config and CMake configs), its NCCL net
 plugin (libnccl-net-lbcc.so, NCCL_NET_PLUGIN=lbcc), the lbcc and lbcc_perf
 tools and the lbcc Python package for python$pyver.
CONTROL
printf 'LBCC %s. Built from the LBCC source tree.\n' "$version" > "$deb/usr/share/doc/lbcc/copyright"
dpkg-deb --root-owner-group --build "$deb" "$out/lbcc_${version}_amd64.deb" >/dev/null

# (b) The relocatable tarball.
root=$work/tar/lbcc-$version
"$here/install_files.sh" --libdir=lib "$liblbcc" "$header" "$root" >/dev/null
install -D -m 0755 "$plugin" "$root/lib/libnccl-net-lbcc.so"
install -D -m 0755 "$lbcc" "$root/bin/lbcc"
install -D -m 0755 "$perf" "$root/bin/lbcc_perf"
LBCC_PYTHON=$python "$here/../python/install_files.sh" "$pypkg" "$pyext" \
  "$root/lib/python3/site-packages" >/dev/null
find "$root" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec chmod u+w {} + \
  -exec strip --strip-unneeded {} +
# The libraries the objects load, except glibc, the C++ runtime and UCX (with libnuma).
keep='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libstdc\+\+|libgcc_s|libucp|libucs|libuct|libucm|libnuma)'
for object in "$root/lib/liblbcc.so.$version" "$root/lib/libnccl-net-lbcc.so" "$root"/bin/* \
              "$root"/lib/python3/site-packages/lbcc/_lbcc*.so; do
  ldd "$object" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    [[ $name =~ $keep || -e $root/lib/$name ]] || { cp -L "$path" "$root/lib/$name"; chmod 0644 "$root/lib/$name"; }
  done
done
cat > "$root/README" <<README
LBCC $version, relocatable: unpack anywhere.
  C:      PKG_CONFIG_PATH=\$PWD/lib/pkgconfig cc t.c \$(pkg-config --cflags --libs lbcc)
  CMake:  cmake -DCMAKE_PREFIX_PATH=\$PWD ...   find_package(lbcc)  target_link_libraries(t lbcc::lbcc)
  Python: PYTHONPATH=\$PWD/lib/python3/site-packages python$pyver -c "import lbcc"
  NCCL:   NCCL_NET_PLUGIN=\$PWD/lib/libnccl-net-lbcc.so
  Tools:  bin/lbcc, bin/lbcc_perf
Needs glibc, libstdc++ (GCC 12 or newer), UCX 1.x (libucp.so.0 on the dynamic linker's path;
LBCC loads it into a link-map namespace of its own) and, for Python, numpy.
README
tar -C "$work/tar" -czf "$out/lbcc-$version-linux-x86_64.tar.gz" "lbcc-$version"
echo "$out/lbcc_${version}_amd64.deb"
echo "$out/lbcc-$version-linux-x86_64.tar.gz"
