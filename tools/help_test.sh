#!/usr/bin/env bash
# One flag style everywhere: every LBCC binary and script answers --help with exit 0 and does
# nothing else (no build, install or package step runs: bazel, apt-get, sudo, dpkg-deb, cmake,
# install and tar are stubs here that record any call; no file appears in the working folder,
# HOME or a prefix given on the command line), and rejects an unknown flag with a non-zero exit
# and a message naming it.
#   help_test.sh BINARY... -- SCRIPT...
set -euo pipefail
source "$(dirname "$0")/flags.sh"
flags_positional "BINARY... -- SCRIPT..." "binaries, then scripts"
flags_parse "$@"
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }
stubs=$tmp/stubs
mkdir -p "$stubs" "$tmp/home" "$tmp/cwd"
for tool in bazel apt-get sudo dpkg-deb cmake install tar debootstrap; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/calls"\nexit 1\n' "$tool" "$tmp" > "$stubs/$tool"
  chmod +x "$stubs/$tool"
done
listing() { { find "$tmp/cwd" "$tmp/home" "$tmp/prefix" 2>/dev/null || true; } | sort; }
count=0
for program in "$@"; do
  [[ $program == -- ]] && continue
  name=$(basename "$program")
  [[ $program == /* ]] || program=$PWD/$program
  before=$(listing)
  set +e
  (cd "$tmp/cwd" && HOME=$tmp/home PATH=$stubs:$PATH "$program" --help "$tmp/prefix") \
    > "$tmp/help.txt" 2>&1
  rc=$?
  set -e
  # Google Benchmark's binaries take no positional argument after --help; retry without it.
  if ((rc != 0)); then
    set +e
    (cd "$tmp/cwd" && HOME=$tmp/home PATH=$stubs:$PATH "$program" --help) > "$tmp/help.txt" 2>&1
    rc=$?
    set -e
  fi
  ((rc == 0)) || fail "$name --help: exit $rc: $(head -5 "$tmp/help.txt")"
  [[ $(wc -l < "$tmp/help.txt") -ge 2 ]] || fail "$name --help printed $(cat "$tmp/help.txt")"
  [[ ! -e $tmp/calls ]] || fail "$name --help ran $(cat "$tmp/calls")"
  [[ $(listing) == "$before" ]] || fail "$name --help wrote files: $(diff <(echo "$before") <(listing))"
  set +e
  (cd "$tmp/cwd" && HOME=$tmp/home PATH=$stubs:$PATH "$program" --no-such-flag=1) \
    > "$tmp/out.txt" 2> "$tmp/err.txt"
  rc=$?
  set -e
  ((rc != 0)) || fail "$name --no-such-flag: exit 0"
  grep -q -- "--no-such-flag" "$tmp/err.txt" || fail "$name: the error does not name the flag: $(cat "$tmp/err.txt")"
  [[ ! -e $tmp/calls ]] || fail "$name --no-such-flag ran $(cat "$tmp/calls")"
  count=$((count + 1))
done
echo "help_test: $count programs answer --help and reject unknown flags by name"
