#!/usr/bin/env bash
# The .deb in a fresh Debian 12 (bookworm) root: `apt-get install ./lbcc_0.1.0_amd64.deb`
# resolves its Depends from the Debian archive, then the C example (built here against the
# package's header and library) runs there, `import lbcc` works in its python3, and lbcc and
# lbcc_perf run; no Abseil package is installed there (each object carries its own). Slow (minutes; the first run debootstraps, later runs unpack the root from
# ~/.cache/lbcc/debian12-bookworm-minbase.tar.gz) and needs root and the Debian archive: not in
# the default suite. Run it as
#   bazel test //tools:package_test          (tagged manual)
#   LBCC_PACKAGE_TEST=1 tools/test           (tools/test adds it)
#   tools/package_test.sh PACKAGE_FILES LIBLBCC HEADER PLUGIN PYEXT PYPKG LBCC LBCC_PERF EXAMPLE
# The install log goes to stdout and to $TEST_UNDECLARED_OUTPUTS_DIR/package_test.log. Without
# root, unshare or network access it prints SKIP and why, and exits 0.
set -euo pipefail
source "$(dirname "$0")/flags.sh"
flags_value mirror http://deb.debian.org/debian "Debian mirror for debootstrap and apt"
flags_positional "PACKAGE_FILES LIBLBCC HEADER PLUGIN PYEXT PYPKG LBCC LBCC_PERF EXAMPLE" "files"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 9)) || { echo "package_test.sh: needs 9 files (see --help)" >&2; exit 2; }
set -- "${FLAGS_ARGS[@]}"
pack=$1 header=$3 example=$9
# debootstrap, chroot and unshare live in sbin (Bazel runs tests with a short PATH).
export PATH=$PATH:/usr/sbin:/sbin
skip() { echo "SKIP: $*"; exit 0; }
[[ $(id -u) -eq 0 ]] || skip "needs root (chroot, mounts)"
command -v debootstrap > /dev/null || skip "debootstrap is not installed (tools/setup)"
command -v unshare > /dev/null || skip "unshare is not installed"
tmp=${TEST_TMPDIR:-$(mktemp -d)}
log=${TEST_UNDECLARED_OUTPUTS_DIR:-$tmp}/package_test.log
: > "$log"
say() { echo "$*" >> "$log"; }  # The log is printed once, at the end.
# Bazel points HOME at the test's scratch folder: the cache lives in the user's real home.
cache=$(getent passwd "$(id -un)" | cut -d: -f6)/.cache/lbcc
rootfs_tar=$cache/debian12-bookworm-minbase.tar.gz
root=$tmp/root
rm -rf "$root"
mkdir -p "$root" "$cache"

say "== package_test: building the .deb"
"$pack" --out="$tmp/out" "${@:2:7}" >> "$log"
deb=$tmp/out/lbcc_0.1.0_amd64.deb
dpkg-deb -f "$deb" Package Version Depends Recommends >> "$log"

if [[ -f $rootfs_tar ]]; then
  say "== package_test: Debian 12 root from $rootfs_tar"
  tar -C "$root" -xzf "$rootfs_tar"
else
  say "== package_test: debootstrap --variant=minbase bookworm (cached in $rootfs_tar)"
  if ! debootstrap --variant=minbase bookworm "$root" "$FLAG_mirror" >> "$log" 2>&1; then
    cat "$log"
    skip "debootstrap failed (no access to $FLAG_mirror?)"
  fi
  tar -C "$root" -czf "$rootfs_tar.tmp" . && mv "$rootfs_tar.tmp" "$rootfs_tar"
fi
say "== package_test: $(cat "$root/etc/debian_version" 2>/dev/null | sed 's/^/Debian /')"

# The C example, built here against the package's own header and library (no compiler in the
# root): it links liblbcc.so.0 by soname, found in the root's /usr/lib/x86_64-linux-gnu.
dpkg-deb -x "$deb" "$tmp/deb"
cc -std=c99 -Wall -Werror -I"$tmp/deb/usr/include" "$example" -L"$tmp/deb/usr/lib/x86_64-linux-gnu" \
  -llbcc -o "$tmp/example"
cp "$deb" "$root/tmp/lbcc.deb"
cp "$tmp/example" "$root/tmp/example"
cp /etc/resolv.conf "$root/etc/resolv.conf"

# Private mounts (proc, sys, /dev, /dev/shm: UCX reads them) that vanish with the unshared namespace.
set +e
unshare --mount --propagation private bash -euo pipefail -c '
root=$1
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/dev/shm"
run() { echo "# chroot: $*"; chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
export DEBIAN_FRONTEND=noninteractive
run apt-get update -qq
run apt-get install -y --no-install-recommends /tmp/lbcc.deb
run dpkg -s lbcc | sed -n "s/^\(Status\|Version\|Depends\):/\1:/p"
run ldd /usr/lib/x86_64-linux-gnu/liblbcc.so.0
run /tmp/example
run python3 -c "import lbcc, sys; c = lbcc.DenseQuantCodec(\"bf16\"); print(\"import lbcc\", lbcc.__version__, \"from\", lbcc.__file__, \"python\", sys.version.split()[0])"
run lbcc version
run env UCX_MEM_EVENTS=no LBCC_TIMEOUT_S=60 lbcc_perf --local 2 -b 1K -e 16K -f 4 -n 2 --quiet
' package_test "$root" >> "$log" 2>&1
rc=$?
set -e
# What apt installed in the root, read from its dpkg database.
say "== package_test: Abseil packages in the root: $(grep -c '^Package: libabsl' "$root/var/lib/dpkg/status" || true)"
say "== package_test: UCX packages in the root: $(sed -n 's/^Package: \(libucx.*\|ucx.*\)/\1/p' "$root/var/lib/dpkg/status" | tr '\n' ' ')"
cat "$log"
grep -qx "liblbcc 100: ok" "$log" || { echo "FAIL: the C example did not run (exit $rc)"; exit 1; }
grep -q "^import lbcc " "$log" || { echo "FAIL: import lbcc (exit $rc)"; exit 1; }
grep -q "^# Out of bounds values : 0 OK" "$log" || { echo "FAIL: lbcc_perf (exit $rc)"; exit 1; }
grep -qx "== package_test: Abseil packages in the root: 0" "$log" || { echo "FAIL: Abseil is installed in the root (exit $rc)"; exit 1; }
((rc == 0)) || { echo "FAIL: a chroot step exited $rc"; exit 1; }
echo "package_test: the .deb installs and runs in a fresh Debian 12 root"
