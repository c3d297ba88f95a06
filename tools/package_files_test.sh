#!/usr/bin/env bash
# tools/package_files.sh on Bazel's outputs: the .deb's Depends and files; the tarball moved to
# another folder still works (relocatable): a C program built with its pkg-config file and one
# built by CMake with find_package(lbcc) run, `import lbcc` works, its tools run, and no Abseil
# is needed anywhere (each object carries its own: no libabsl in Depends, in lib/ or in ldd).
set -euo pipefail
source "$(dirname "$0")/flags.sh"
flags_positional "PACKAGE_FILES LIBLBCC HEADER PLUGIN PYEXT PYPKG LBCC LBCC_PERF EXAMPLE" "files"
flags_parse "$@"
set -- "${FLAGS_ARGS[@]}"
pack=$1 example=${9}
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
"$pack" --out="$tmp/out" "${@:2:7}" > /dev/null

deb=$tmp/out/lbcc_0.1.0_amd64.deb
depends=$(dpkg-deb -f "$deb" Depends)
for d in "libc6 " "libstdc++6 " "libucx0 " "python3 (>= 3." "python3-numpy"; do
  [[ $depends == *"$d"* ]] || fail "Depends lacks '$d': $depends"
done
[[ $depends != *libabsl* ]] || fail "Depends names Abseil: $depends"
files=$(dpkg-deb -c "$deb" | awk '{print $6}')
for f in ./usr/lib/x86_64-linux-gnu/liblbcc.so.0.1.0 ./usr/lib/x86_64-linux-gnu/libnccl-net-lbcc.so \
         ./usr/include/lbcc.h ./usr/lib/x86_64-linux-gnu/pkgconfig/lbcc.pc \
         ./usr/lib/x86_64-linux-gnu/cmake/lbcc/lbccConfig.cmake ./usr/bin/lbcc ./usr/bin/lbcc_perf \
         "./usr/lib/python3/dist-packages/lbcc/_lbcc$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"; do
  grep -qxF "$f" <<<"$files" || fail "the .deb lacks $f"
done

# The tarball, unpacked and then moved: nothing may point at the first folder.
mkdir -p "$tmp/first"
tar -C "$tmp/first" -xzf "$tmp/out/lbcc-0.1.0-linux-x86_64.tar.gz"
mv "$tmp/first/lbcc-0.1.0" "$tmp/moved"
root=$tmp/moved
bundled=$(ls "$root/lib")
if grep -E "^lib(absl|ucp|ucs|uct|ucm)" <<<"$bundled"; then fail "the tarball bundles Abseil or UCX: $(echo $bundled)"; fi
for object in "$root/lib/liblbcc.so.0.1.0" "$root/lib/libnccl-net-lbcc.so" "$root"/bin/* \
              "$root"/lib/python3/site-packages/lbcc/_lbcc*.so; do
  deps=$(ldd "$object")
  grep -q "not found" <<<"$deps" && fail "$object: $deps"
  if grep -q "libabsl" <<<"$deps"; then fail "$object loads an Abseil: $deps"; fi
done
PKG_CONFIG_PATH=$root/lib/pkgconfig cc -std=c99 -Wall -Werror "$example" \
  $(PKG_CONFIG_PATH=$root/lib/pkgconfig pkg-config --cflags --libs lbcc) -o "$tmp/pc_example"
[[ $("$tmp/pc_example") == "liblbcc 100: ok" ]] || fail "pkg-config example"

mkdir -p "$tmp/cmake_src"
cp "$example" "$tmp/cmake_src/example.c"
cat > "$tmp/cmake_src/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.13)
project(lbcc_consumer C)
find_package(lbcc 0.1 REQUIRED)
add_executable(example example.c)
target_link_libraries(example lbcc::lbcc)
CMAKE
cmake -S "$tmp/cmake_src" -B "$tmp/cmake_build" -DCMAKE_PREFIX_PATH="$root" > "$tmp/cmake.log" 2>&1 ||
  fail "cmake configure: $(cat "$tmp/cmake.log")"
cmake --build "$tmp/cmake_build" > "$tmp/cmake_build.log" 2>&1 || fail "cmake build: $(cat "$tmp/cmake_build.log")"
[[ $("$tmp/cmake_build/example") == "liblbcc 100: ok" ]] || fail "CMake example"

"$root/bin/lbcc" version | grep -q "^LBCC 0.1.0" || fail "bin/lbcc version"
"$root/bin/lbcc_perf" --help > /dev/null || fail "bin/lbcc_perf --help"
(cd "$tmp" && PYTHONPATH=$root/lib/python3/site-packages PYTHONDONTWRITEBYTECODE=1 python3 -c '
import lbcc, os, sys
assert os.path.realpath(lbcc.__file__).startswith(os.path.realpath(sys.argv[1])), lbcc.__file__
codec = lbcc.DenseQuantCodec("bf16")
print("import lbcc", lbcc.__version__, "ok")' "$root") || fail "python import"
echo "package_files: .deb and relocatable tarball checked"
