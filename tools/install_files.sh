#!/usr/bin/env bash
# Installs a built liblbcc.so, its header and a pkg-config file under a prefix.
#   tools/install_files.sh LIB HEADER PREFIX
# (tools/install_lib builds the library and calls this; tests call it on their own copy.)
set -euo pipefail
source "$(dirname "$0")/flags.sh"
flags_positional "LIB HEADER PREFIX" "the built liblbcc.so, comm/lbcc.h, the install prefix"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 3)) || { echo "install_files.sh: needs LIB HEADER PREFIX (see --help)" >&2; exit 2; }
lib=${FLAGS_ARGS[0]} header=${FLAGS_ARGS[1]} prefix=${FLAGS_ARGS[2]}
version=0.1.0
install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 "$lib" "$prefix/lib/liblbcc.so.$version"
ln -sf "liblbcc.so.$version" "$prefix/lib/liblbcc.so.0"
ln -sf "liblbcc.so.0" "$prefix/lib/liblbcc.so"
install -m 0644 "$header" "$prefix/include/lbcc.h"
cat > "$prefix/lib/pkgconfig/lbcc.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: lbcc
Description: Low-Bandwidth Collective Communication (C API)
Version: $version
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -llbcc
Cflags: -I\${includedir}
PC
echo "installed liblbcc $version under $prefix (pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig)"
