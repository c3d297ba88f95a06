#!/usr/bin/env bash
# End-to-end test of `lbcc codec encode|decode|inspect`: round trips through files, error-feedback
# state files, aggregation of two replicas, and the exit codes of bad input.
set -euo pipefail
source "$(dirname "$0")/flags.sh"
flags_positional "LBCC" "the lbcc binary"
flags_parse "$@"
((${#FLAGS_ARGS[@]} == 1)) || { echo "lbcc_codec_test.sh: needs LBCC" >&2; exit 2; }
lbcc=${FLAGS_ARGS[0]}
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# 128 x 256 float32: a ramp (4 bytes per value, little-endian) and zeros.
python3 - "$tmp" <<'PY' 2>/dev/null || perl -e 'open(F,">$ARGV[0]/ramp.f32"); binmode F; print F pack("f<*", map { ($_ % 97) - 48.5 } 0..32767);' "$tmp"
import struct, sys
with open(sys.argv[1] + "/ramp.f32", "wb") as f:
    f.write(struct.pack("<32768f", *[(i % 97) - 48.5 for i in range(32768)]))
PY
head -c $((4 * 32768)) /dev/zero > "$tmp/zeros.f32"

"$lbcc" codec encode --in="$tmp/ramp.f32" --shape=128,256 --out="$tmp/r0.lbcc" \
    --state_out="$tmp/ef.f32" > "$tmp/encode.txt"
grep -q "k 64 per chunk, 512 selected" "$tmp/encode.txt" || fail "encode summary: $(cat "$tmp/encode.txt")"
[[ $(stat -c %s "$tmp/ef.f32") -eq $((4 * 32768)) ]] || fail "state file size"
"$lbcc" codec encode --in="$tmp/zeros.f32" --shape=128,256 --state_in="$tmp/ef.f32" \
    --indices=packed12 --out="$tmp/r1.lbcc" > /dev/null
"$lbcc" codec inspect "$tmp/r0.lbcc" "$tmp/r1.lbcc" > "$tmp/inspect.txt"
grep -q "topk_ef v1, f32\[128, 256\]" "$tmp/inspect.txt" || fail "inspect: $(cat "$tmp/inspect.txt")"
grep -q "indices packed12" "$tmp/inspect.txt" || fail "inspect packed12"
grep -q "bits/param" "$tmp/inspect.txt" || fail "inspect bits/param"

"$lbcc" codec decode --out="$tmp/update.f32" --aggregate=sparseloco "$tmp/r0.lbcc" "$tmp/r1.lbcc" \
    > /dev/null
[[ $(stat -c %s "$tmp/update.f32") -eq $((4 * 32768)) ]] || fail "decoded size"
cmp -s "$tmp/update.f32" "$tmp/zeros.f32" && fail "decoded update is all zeros"
"$lbcc" codec decode --out="$tmp/update.f32" --accumulate --aggregate=sum "$tmp/r0.lbcc" > /dev/null

"$lbcc" codec encode --codec=dense_quant --format=int8 --block=64 --in="$tmp/ramp.f32" \
    --shape=32768 --out="$tmp/d.lbcc" > /dev/null
"$lbcc" codec decode --out="$tmp/dense.f32" "$tmp/d.lbcc" > /dev/null
[[ $(stat -c %s "$tmp/dense.f32") -eq $((4 * 32768)) ]] || fail "dense decoded size"

# Bad input: wrong shape (2), unknown option (2), corrupt payload (1), mixed shapes (2).
set +e
"$lbcc" codec encode --in="$tmp/ramp.f32" --shape=128,255 --out="$tmp/x" 2>/dev/null; [[ $? -eq 2 ]] || fail "shape mismatch exit"
"$lbcc" codec encode --bogus=1 2>/dev/null; [[ $? -eq 2 ]] || fail "unknown option exit"
cp "$tmp/r0.lbcc" "$tmp/bad.lbcc"
printf '\x5a' | dd of="$tmp/bad.lbcc" bs=1 seek=8 conv=notrunc 2>/dev/null  # dtype byte
"$lbcc" codec decode --out="$tmp/x" "$tmp/bad.lbcc" 2>"$tmp/err.txt"; [[ $? -eq 1 ]] || fail "corrupt exit"
grep -q "DATA_LOSS" "$tmp/err.txt" || fail "corrupt message: $(cat "$tmp/err.txt")"
"$lbcc" codec decode --out="$tmp/x" "$tmp/r0.lbcc" "$tmp/d.lbcc" 2>/dev/null; [[ $? -eq 2 ]] || fail "mixed exit"
"$lbcc" codec --help | grep -q "aggregate" || fail "help"
set -e
echo "lbcc codec: all checks passed"
