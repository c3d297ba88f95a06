#!/usr/bin/env bash
# Installs a built liblbcc.so, its header, a pkg-config file and a CMake package config under a
# prefix (both relocatable: they find the prefix from their own location).
#   tools/install_files.sh [--libdir=lib] [--norpath] LIB HEADER PREFIX
#   cc my_trainer.c $(pkg-config --cflags --libs lbcc)        (PKG_CONFIG_PATH=PREFIX/LIBDIR/pkgconfig)
#   find_package(lbcc) + target_link_libraries(t lbcc::lbcc)  (CMAKE_PREFIX_PATH=PREFIX)
# (tools/install_lib builds the library and calls this; tools/package and tests call it on their
# own copy.)
set -euo pipefail
source "$(dirname "$0")/flags.sh"
flags_value libdir lib "library folder below PREFIX (Debian: lib/x86_64-linux-gnu)"
flags_bool rpath "pkg-config's Libs carry -Wl,-rpath to LIBDIR (--norpath for system prefixes)"
FLAG_rpath=1
flags_positional "LIB HEADER PREFIX" "the built liblbcc.so, comm/lbcc.h, the install prefix"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 3)) || { echo "install_files.sh: needs LIB HEADER PREFIX (see --help)" >&2; exit 2; }
lib=${FLAGS_ARGS[0]} header=${FLAGS_ARGS[1]} prefix=${FLAGS_ARGS[2]} libdir=$FLAG_libdir
version=0.1.0
# From LIBDIR/pkgconfig and LIBDIR/cmake/lbcc back up to PREFIX.
up=$(echo "$libdir" | sed -E 's#[^/]+#..#g')
install -d "$prefix/$libdir/pkgconfig" "$prefix/$libdir/cmake/lbcc" "$prefix/include"
install -m 0755 "$lib" "$prefix/$libdir/liblbcc.so.$version"
ln -sf "liblbcc.so.$version" "$prefix/$libdir/liblbcc.so.0"
ln -sf "liblbcc.so.0" "$prefix/$libdir/liblbcc.so"
install -m 0644 "$header" "$prefix/include/lbcc.h"
rpath=""
((FLAG_rpath)) && rpath=' -Wl,-rpath,${libdir}'
cat > "$prefix/$libdir/pkgconfig/lbcc.pc" <<PC
prefix=\${pcfiledir}/../$up
libdir=\${prefix}/$libdir
includedir=\${prefix}/include

Name: lbcc
Description: Low-Bandwidth Collective Communication (C API)
Version: $version
Libs: -L\${libdir}$rpath -llbcc
Cflags: -I\${includedir}
PC
cat > "$prefix/$libdir/cmake/lbcc/lbccConfig.cmake" <<CMAKE
# find_package(lbcc): LBCC's C API (lbcc.h, liblbcc.so) as the imported target lbcc::lbcc.
# Relocatable: the prefix is found from this file's location.
get_filename_component(_lbcc_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../$up" ABSOLUTE)
if(NOT TARGET lbcc::lbcc)
  add_library(lbcc::lbcc SHARED IMPORTED)
  set_target_properties(lbcc::lbcc PROPERTIES
    IMPORTED_LOCATION "\${_lbcc_prefix}/$libdir/liblbcc.so.$version"
    IMPORTED_SONAME "liblbcc.so.0"
    INTERFACE_INCLUDE_DIRECTORIES "\${_lbcc_prefix}/include")
endif()
set(lbcc_INCLUDE_DIRS "\${_lbcc_prefix}/include")
set(lbcc_LIBRARIES lbcc::lbcc)
unset(_lbcc_prefix)
CMAKE
cat > "$prefix/$libdir/cmake/lbcc/lbccConfigVersion.cmake" <<CMAKE
# Same major version (0.x: same minor) is compatible.
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
elseif(PACKAGE_FIND_VERSION_MAJOR STREQUAL "0" AND NOT PACKAGE_FIND_VERSION_MINOR STREQUAL "1")
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CMAKE
echo "installed liblbcc $version under $prefix (pkg-config: PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig; CMake: CMAKE_PREFIX_PATH=$prefix)"
