#!/usr/bin/env bash
# Installs the `lbcc` Python package: the sources of PKG_DIR (python/lbcc) and a built
# _lbcc.so into DEST/lbcc, the extension named with the interpreter's ABI tag
# (_lbcc.cpython-311-x86_64-linux-gnu.so for Debian 12's python3; LBCC_PYTHON picks another),
# and with --c10d the torch.distributed backend's extension (_c10d_lbcc.so; it needs libtorch).
#   python/install_files.sh [--c10d C10D_SO] PKG_DIR SO DEST
# (python/install builds the extension and calls this; python:install_test and tools/package
# call it on their own copy.)
set -euo pipefail
source "$(dirname "$0")/../tools/flags.sh"
flags_positional "PKG_DIR SO DEST" "python/lbcc, the built _lbcc.so, the site folder"
flags_value c10d "" "the built _c10d_lbcc.so (torch.distributed backend) to install too"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 3)) || { echo "install_files.sh: needs PKG_DIR SO DEST (see --help)" >&2; exit 2; }
pkg=${FLAGS_ARGS[0]} so=${FLAGS_ARGS[1]} dest=${FLAGS_ARGS[2]}
suffix=$("${LBCC_PYTHON:-/usr/bin/python3}" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
rm -rf "$dest/lbcc"
install -d "$dest/lbcc/torch"
for f in "$pkg"/*.py; do install -m 0644 "$f" "$dest/lbcc/"; done
for f in "$pkg"/torch/*.py; do install -m 0644 "$f" "$dest/lbcc/torch/"; done
install -m 0755 "$so" "$dest/lbcc/_lbcc$suffix"
if [[ -n $FLAG_c10d ]]; then install -m 0755 "$FLAG_c10d" "$dest/lbcc/_c10d_lbcc$suffix"; fi
echo "installed lbcc into $dest/lbcc (extension _lbcc$suffix${FLAG_c10d:+, _c10d_lbcc$suffix})"
