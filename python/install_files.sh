#!/usr/bin/env bash
# Installs the `lbcc` Python package: the sources of PKG_DIR (python/lbcc) and a built
# _lbcc.so into DEST/lbcc.
#   python/install_files.sh PKG_DIR SO DEST
# (python/install builds the extension and calls this; python:install_test calls it on its
# own copy.)
set -euo pipefail
pkg=$1 so=$2 dest=$3
rm -rf "$dest/lbcc"
install -d "$dest/lbcc/torch"
for f in "$pkg"/*.py; do install -m 0644 "$f" "$dest/lbcc/"; done
for f in "$pkg"/torch/*.py; do install -m 0644 "$f" "$dest/lbcc/torch/"; done
install -m 0755 "$so" "$dest/lbcc/_lbcc.so"
echo "installed lbcc into $dest/lbcc"
