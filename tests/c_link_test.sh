#!/usr/bin/env bash
# Installs liblbcc.so with tools/install_files.sh into a temporary prefix, builds a C program
# against it with pkg-config and the system C compiler, and runs it.
set -euo pipefail
lib=$1 header=$2 installer=$3 example=$4
prefix="$TEST_TMPDIR/prefix"
"$installer" "$lib" "$header" "$prefix"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cc -std=c99 -Wall -Werror "$example" $(pkg-config --cflags --libs lbcc) -o "$TEST_TMPDIR/example"
output=$("$TEST_TMPDIR/example")
echo "$output"
[[ "$output" == "liblbcc 100: ok" ]]
