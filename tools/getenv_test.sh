#!/usr/bin/env bash
# Settings are resolved once (comm/config.h): library code reads the environment only through
# base/env (whose read counter //comm:config_test checks after Init). This fails on a getenv,
# secure_getenv or environ in library sources of the tree that README lies in; tests, fuzz
# targets, benchmarks, perf tools and test-only helpers (transport/subprocess.cc hands its
# environment to the processes it starts) may read what they like.
#   getenv_test.sh README
set -euo pipefail
source "$(dirname "$0")/flags.sh"
flags_positional "README" "the tree's README.md"
flags_parse "$@"
if ((${#FLAGS_ARGS[@]} != 1)); then
  echo "getenv_test.sh: needs README" >&2
  exit 2
fi
root=$(dirname "$(readlink -f "${FLAGS_ARGS[0]}")")
cd "$root"
hits=$(grep -rnE '\b(secure_)?getenv\s*\(|\benviron\b' \
  --include='*.cc' --include='*.h' --include='*.cu' --include='*.cuh' \
  base codecs kernels transport comm plugin python plan |
  grep -vE '^transport/subprocess\.cc:|^base/env\.cc:|^base/scoped_env\.h:|_test\.(cc|h):|_fuzz[a-z_]*\.cc:|_benchmark\.cc:|_perf\.cc:|/testing/|^[^:]*testing\.h:' || true)
if [[ -n $hits ]]; then
  echo "getenv_test: library code reads the environment outside base/env (use env::Get* or" \
    "env::GetForeign at configuration time):" >&2
  echo "$hits" >&2
  exit 1
fi
n=$(grep -rlE '\benv::Get' --include='*.cc' base codecs kernels transport comm plugin python plan | wc -l)
echo "getenv_test: no direct environment reads in library code ($n files read through base/env)"
