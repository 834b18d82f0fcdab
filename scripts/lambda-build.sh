#!/usr/bin/env bash
# Builds the example Lambda function (runlease-worker-lambda's `bootstrap`)
# for the provided.al2023 runtime on x86_64 and arm64 with cargo-lambda (zig
# links against an old glibc, so the binaries run on Amazon Linux 2023), and
# checks each output is an ELF executable for its architecture.
#
#   scripts/lambda-build.sh             debug builds (CI: fast enough, proves it links)
#   scripts/lambda-build.sh --release   what you deploy
#
# Outputs: $CARGO_TARGET_DIR/lambda/<arch>/bootstrap/bootstrap (target/ by
# default), arch = x86_64 | arm64. cargo-lambda alone would put both in
# target/lambda/bootstrap/, the second build replacing the first.
set -euo pipefail
cd "$(dirname "$0")/.."

profile_args=()
[ "${1:-}" = "--release" ] && profile_args=(--release)

if ! cargo lambda --version >/dev/null 2>&1; then
  echo "cargo-lambda is missing: pip install cargo-lambda (about 20 s; it brings zig)" >&2
  exit 1
fi
for t in x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu; do
  if ! rustup target list --installed | grep -qx "$t"; then
    echo "the Rust target $t is missing: rustup target add $t" >&2
    exit 1
  fi
done

target_dir=${CARGO_TARGET_DIR:-$PWD/target}
case "$target_dir" in /*) ;; *) target_dir=$PWD/$target_dir ;; esac

# ELF header: EI_CLASS at 4 (2 = 64-bit), EI_DATA at 5 (1 = little-endian),
# e_type at 16 (2 = executable, 3 = shared object / PIE), e_machine at 18.
check_elf() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
path, want = sys.argv[1], int(sys.argv[2], 16)
with open(path, "rb") as f:
    head = f.read(20)
if len(head) < 20 or head[:4] != b"\x7fELF":
    sys.exit(f"{path}: not an ELF file")
if head[4] != 2 or head[5] != 1:
    sys.exit(f"{path}: not a 64-bit little-endian ELF")
e_type, e_machine = struct.unpack("<HH", head[16:20])
if e_type not in (2, 3):
    sys.exit(f"{path}: ELF type {e_type} is not an executable")
if e_machine != want:
    sys.exit(f"{path}: ELF machine {e_machine:#x}, expected {want:#x}")
PY
}

for arch in x86_64 arm64; do
  case "$arch" in
    x86_64) flag=--x86-64 machine=0x3e ;; # EM_X86_64
    arm64) flag=--arm64 machine=0xb7 ;;   # EM_AARCH64
  esac
  out_dir=$target_dir/lambda/$arch
  started=$(date +%s)
  cargo lambda build --bin bootstrap -p runlease-worker-lambda "$flag" \
    --lambda-dir "$out_dir" "${profile_args[@]}"
  elapsed=$(( $(date +%s) - started ))
  binary=$out_dir/bootstrap/bootstrap
  if [ ! -x "$binary" ]; then
    echo "cargo lambda build did not produce $binary" >&2
    exit 1
  fi
  check_elf "$binary" "$machine"
  echo "ok: $binary ($arch, $(du -h "$binary" | cut -f1), built in ${elapsed}s)"
done
