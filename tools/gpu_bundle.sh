# GPU bundles: binaries built here with --config=cuda, plus the shared libraries they need, for a
# GPU machine that has neither Bazel nor LBCC's Debian packages. Sourced by kernels/gpu_check.sh
# and plugin/gpu_check.sh; not a command of its own.
#
#   gpu_bundle_pack DIR FILE...   replace DIR with DIR/bin (the FILEs: executables or .so files)
#                                 and DIR/lib (every shared library they load, except those a GPU
#                                 machine has: glibc, the CUDA driver, cuBLAS; the C++ runtime
#                                 goes to DIR/lib/cxx), stripped, and DIR/MANIFEST (commit, date,
#                                 nvcc)
#   gpu_bundle_env DIR [nocxx]    export LD_LIBRARY_PATH: DIR/lib, DIR/lib/cxx (not with nocxx:
#                                 for a process such as Python whose own C++ runtime may be
#                                 newer), then the CUDA toolkit's and PyTorch's nvidia-* wheels'
#                                 library folders (cuBLAS, cudart)
#   gpu_bundle_missing FILE...    print "name: lib lib" for each FILE that has libraries not found
#   gpu_check_start TITLE         start $OUT/summary.txt (SUMMARY; note() prints and appends a
#                                 line), note TITLE and the commit, then the GPU; without a
#                                 visible NVIDIA GPU note MISSING and exit 2
#   gpu_check_parse SCRIPT [ARG]  set `mode` (check, pack or build) from a check script's one
#                                 argument; --help prints SCRIPT's header comment and exits 0,
#                                 anything else exits 2

# Shared libraries a bundle leaves to the GPU machine: glibc, the driver, cuBLAS (hundreds of MB;
# CUDA and PyTorch images carry it).
GPU_BUNDLE_SYSTEM_LIBS='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libcuda\.so|libcublas|libnvidia)'

gpu_bundle_pack() {
  local dir=$1 file name path
  shift
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib/cxx"
  for file in "$@"; do
    cp "$file" "$dir/bin/"
    chmod u+w "$dir/bin/$(basename "$file")"
    ldd "$file" | awk '/=> \//{print $1, $3}' | while read -r name path; do
      if [[ $name =~ ^(libstdc\+\+|libgcc_s)\. ]]; then
        cp -L "$path" "$dir/lib/cxx/$name"
      elif [[ ! $name =~ $GPU_BUNDLE_SYSTEM_LIBS ]]; then
        cp -L "$path" "$dir/lib/$name"
      fi
    done
  done
  strip --strip-unneeded "$dir"/bin/* "$dir"/lib/*.so* "$dir"/lib/cxx/* 2>/dev/null || true
  {
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) with $("${CUDA_PATH:-/usr/local/cuda}/bin/nvcc" --version | tail -1)"
  } > "$dir/MANIFEST"
}

gpu_bundle_env() {
  local dir=$1 cuda=${CUDA_PATH:-/usr/local/cuda} d path=$1/lib
  [[ ${2:-} == nocxx ]] || path="$path:$dir/lib/cxx"
  [[ -n ${LD_LIBRARY_PATH:-} ]] && path="$path:$LD_LIBRARY_PATH"
  for d in "$cuda/lib64" "$cuda/targets/x86_64-linux/lib"; do
    [[ -d $d ]] && path="$path:$d"
  done
  if command -v python3 >/dev/null 2>&1; then
    for d in $(python3 - <<'EOF' 2>/dev/null
import importlib, os
for name in ("nvidia.cublas", "nvidia.cuda_runtime", "nvidia.cu13", "nvidia.cu12"):
    try:
        m = importlib.import_module(name)
    except Exception:
        continue
    for base in list(getattr(m, "__path__", [])):
        for sub in ("lib", "lib64"):
            p = os.path.join(base, sub)
            if os.path.isdir(p):
                print(p)
EOF
    ); do path="$path:$d"; done
  fi
  export LD_LIBRARY_PATH=$path
}

gpu_bundle_missing() {
  local file
  for file in "$@"; do
    if ldd "$file" | grep -q "not found"; then
      echo "$(basename "$file"): $(ldd "$file" | awk '/not found/{print $1}' | tr '\n' ' ')"
    fi
  done
}

gpu_check_parse() {
  local script=$1
  mode=check
  case "${2:-}" in
    --pack) mode=pack ;;
    --build) mode=build ;;
    "") ;;
    -h|--help) sed -n '2,/^[^#]/p' "$script" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$(basename "$script"): unknown option $2 (see --help)" >&2; exit 2 ;;
  esac
}

note() { echo "$*" | tee -a "$SUMMARY"; }

gpu_check_start() {
  mkdir -p "$OUT"
  SUMMARY=$OUT/summary.txt
  : > "$SUMMARY"
  note "== LBCC $1, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    note "GPU: $(nvidia-smi -L | head -1); driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  else
    note "MISSING: no NVIDIA GPU visible (nvidia-smi -L failed); nothing to check"
    exit 2
  fi
}
