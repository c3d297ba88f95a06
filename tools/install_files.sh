#!/usr/bin/env bash
# Installs a built liblbcc.so, its header and a pkg-config file under a prefix.
#   tools/install_files.sh LIB HEADER PREFIX
# (tools/install_lib builds the library and calls this; tests call it on their own copy.)
set -euo pipefail
lib=$1 header=$2 prefix=$3
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
