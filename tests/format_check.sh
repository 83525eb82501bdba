#!/usr/bin/env bash
# The project's own C++ follows .clang-format: lists each file clang-format would change (with the first
# lines of the change) and fails. Fix with: clang-format -i FILE (or scripts/format).
# Exit 77 (skipped) where clang-format is not installed; under CI=true that is a failure.
set -uo pipefail
root="$1"
cd "$root" || exit 1
if ! command -v clang-format >/dev/null; then
  echo "format check: clang-format not installed (apt-get install clang-format, or scripts/bootstrap)"
  [ "${CI:-}" = true ] && exit 1
  exit 77
fi
bad=0
while IFS= read -r f; do
  if ! diff -q "$f" <(clang-format --style=file "$f") >/dev/null; then
    echo "not formatted: $f"
    diff "$f" <(clang-format --style=file "$f") | head -8
    bad=$((bad + 1))
  fi
done < <(git ls-files -- '*.cpp' '*.h' 2>/dev/null || find analysis bench cli common optimizers search studies tests trainer -name '*.cpp' -o -name '*.h')
if [ "$bad" -gt 0 ]; then
  echo "format check: $bad file(s) differ from .clang-format; run scripts/format"
  exit 1
fi
echo "format check: every file follows .clang-format"
