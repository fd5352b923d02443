#!/usr/bin/env bash
# Build libbitparity_npu.so, the torch_npu binding of the Ascend C kernels, on an NPU host.
#
#   scripts/npu_build.sh [extra cmake -D options, e.g. -DBITPARITY_CANN_TOOLCHAIN=ascendc_library]
#
# Environment:
#   CANN_SET_ENV  CANN's set_env.sh, sourced when ASCEND_HOME_PATH is unset
#                 (default /usr/local/Ascend/cann/set_env.sh, else the older
#                 /usr/local/Ascend/ascend-toolkit/set_env.sh)
#   PYTHON        the Python with torch and torch_npu (default python3)
#   BUILD_DIR     default bitparity/backends/ascend/build, where bitparity looks for the library
#
# Configures and builds bitparity/backends/ascend/CMakeLists.txt (which picks the
# CANN >= 9.1 or the CANN 8.x toolchain and says which), then prints the library's
# path.  Never run on an NPU in this project: docs/ascend.md.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SOURCE_DIR="$ROOT/bitparity/backends/ascend"
BUILD_DIR="${BUILD_DIR:-$SOURCE_DIR/build}"
PYTHON="${PYTHON:-python3}"

fail() {
    echo "npu_build.sh: $*" >&2
    exit 1
}

if [[ -z "${ASCEND_HOME_PATH:-}" ]]; then
    set_env="${CANN_SET_ENV:-}"
    if [[ -z "$set_env" ]]; then
        for candidate in /usr/local/Ascend/cann/set_env.sh /usr/local/Ascend/ascend-toolkit/set_env.sh; do
            if [[ -f "$candidate" ]]; then
                set_env="$candidate"
                break
            fi
        done
    fi
    [[ -n "$set_env" ]] ||
        fail "CANN not found: ASCEND_HOME_PATH is unset and no set_env.sh was found (set CANN_SET_ENV to it)"
    [[ -f "$set_env" ]] || fail "CANN not found: CANN_SET_ENV=$set_env does not exist"
    echo "npu_build.sh: sourcing $set_env"
    # set_env.sh reads unset variables, which set -u would reject.
    set +u
    # shellcheck disable=SC1090
    source "$set_env"
    set -u
    [[ -n "${ASCEND_HOME_PATH:-}" ]] || fail "$set_env did not set ASCEND_HOME_PATH"
fi
[[ -d "$ASCEND_HOME_PATH" ]] || fail "ASCEND_HOME_PATH=$ASCEND_HOME_PATH is not a directory"

command -v cmake >/dev/null || fail "cmake is not on PATH"
"$PYTHON" -c "import torch" 2>/dev/null || fail "$PYTHON cannot import torch"
"$PYTHON" -c "import torch_npu" 2>/dev/null ||
    fail "$PYTHON cannot import torch_npu (pip install -e '.[ascend]', a torch_npu matching torch $("$PYTHON" -c 'import torch; print(torch.__version__)'))"

echo "npu_build.sh: CANN at $ASCEND_HOME_PATH; torch $("$PYTHON" -c 'import torch; print(torch.__version__)'), torch_npu $("$PYTHON" -c 'import torch_npu; print(torch_npu.__version__)')"
cmake -S "$SOURCE_DIR" -B "$BUILD_DIR" -DPython3_EXECUTABLE="$(command -v "$PYTHON")" "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)"

LIBRARY="$BUILD_DIR/libbitparity_npu.so"
[[ -f "$LIBRARY" ]] || fail "the build finished but $LIBRARY is missing"
echo "npu_build.sh: built $LIBRARY"
if [[ "$BUILD_DIR" != "$SOURCE_DIR/build" ]]; then
    echo "npu_build.sh: bitparity loads it from there when BITPARITY_ASCEND_NPU_LIB=$LIBRARY"
fi
echo "npu_build.sh: next, python scripts/npu_check.py --out results/ (docs/ascend.md)"
