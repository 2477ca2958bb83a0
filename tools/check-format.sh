#!/usr/bin/env bash
# Fails when a C++ source differs from what clang-format (.clang-format) would write.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
bad=()
for f in $files; do
    clang-format --style=file "$f" | cmp -s - "$f" || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
    echo "check-format: these files need clang-format -i: ${bad[*]}" >&2
    exit 1
fi
echo "check-format: $(echo "$files" | wc -w) files formatted"
