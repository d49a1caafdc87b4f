#!/usr/bin/env bash
# The quick start: `./octet.sh demo` builds and runs the demo, `./octet.sh test` builds everything
# and runs every test. Each installs what is missing first: Debian packages with apt-get (as root,
# or through sudo; otherwise it prints the apt-get line to run and stops), and the Python packages
# of python/requirements.txt into a virtual environment in the clone (.venv), never into the
# system's Python. Run `./octet.sh --help` for the details.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: ./octet.sh <command> [options]

Commands:
  demo    build and run the demo (examples/08_training): cmake --workflow --preset demo
          Needs cmake, ninja-build and g++ (no Python, CUDA or MPI). Its report is written to
          build/demo/training_report/.
  test    build everything and run every test: cmake --workflow --preset test (build/default)
          Needs the Debian packages below and torch, jax and the Python tests' oracles, which go
          into .venv (python/requirements.txt; about 5 minutes and 6 GB the first time). The CMake
          build uses .venv's Python. The CUDA toolkit is optional (/usr/local/cuda is used when
          nvcc is not on PATH).
  setup   install what `test` needs (Debian packages and .venv) and build nothing.

Options:
  --configure-only   (test) install what is missing and configure build/default; build nothing
  --fresh            passed to `cmake --workflow`: configure the build folder from scratch
  -h, --help         this text

Each command installs only what is missing: apt-get (update, then install) when a package is
missing, as root or through sudo; without either it prints the apt-get line and exits with 1. pip
runs when python/requirements.txt has changed since .venv was last filled (or .venv is new).
Environment: OCTET_VENV (default: .venv in the clone) places the virtual environment elsewhere;
OCTET_PYTHON (default: /usr/bin/python3, else python3 on PATH) is the Python that creates it.

Debian packages:
EOF
  echo "  demo: ${demo_packages[*]}"
  echo "  test: ${test_packages[*]}" | fold -s -w 90 | sed -e "s/ *$//" -e "2,$ s/^/        /"
}
short_usage() {
  echo "usage: ./octet.sh demo|test|setup [--fresh] [--configure-only]   (./octet.sh --help says more)" >&2
}

# The demo preset builds one C++ program, host only. The test preset builds everything: MPI for the
# multi-process tests, clang and its runtime for the libFuzzer target and the clang header checks,
# clang-format for the style check (.ci/run), OpenBLAS (found through pkg-config) as the host GEMM
# benchmark's peer, ccache to compile through (CMakeLists.txt), python3-venv for .venv (Debian's
# python3 has no ensurepip without it), python3-dev for torch.compile (inductor compiles C++ that
# includes Python.h), ca-certificates for pip (Debian's pip trusts the system's certificates, not
# certifi's). g++ brings its own ASan/UBSan runtimes (the sanitize preset).
demo_packages=(cmake ninja-build g++)
test_packages=(cmake ninja-build ccache g++ doctest-dev libbenchmark-dev openmpi-bin libopenmpi-dev
               clang libclang-rt-14-dev clang-format libopenblas-dev pkg-config python3 python3-venv
               python3-dev ca-certificates)

root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$root"
venv=$(realpath -m "${OCTET_VENV:-$root/.venv}")
requirements=$root/python/requirements.txt

say() { echo "octet.sh: $*"; }
die() { echo "octet.sh: $*" >&2; exit 1; }

# Installs the Debian packages among "$@" that are not installed; apt-get runs only then.
ensure_packages() {
  if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
    say "not a Debian system (no dpkg-query/apt-get); make sure the equivalents of these are installed: $*"
    return 0
  fi
  local missing=() p
  for p in "$@"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    # sudo where it needs no password, or where it can ask for one (a terminal).
    if command -v sudo >/dev/null && { [ -t 0 ] || sudo -n true 2>/dev/null; }; then
      sudo=(sudo)
    else
      echo "octet.sh: these Debian packages are missing: ${missing[*]}" >&2
      echo "octet.sh: as root, run:" >&2
      echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
      echo "octet.sh: then run this command again" >&2
      exit 1
    fi
  fi
  say "installing the missing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Creates .venv if it is missing or broken and installs python/requirements.txt into it when the
# file changed since the last install (a stamp in .venv holds the file's hash). Puts .venv/bin first
# on PATH, so that CMake's find_program(python3) and the tests find .venv's Python.
ensure_venv() {
  local python=${OCTET_PYTHON:-}
  if [ -z "$python" ]; then
    if [ -x /usr/bin/python3 ]; then python=/usr/bin/python3; else python=$(command -v python3 || true); fi
  fi
  [ -n "$python" ] || die "no python3 found (install python3 python3-venv, or set OCTET_PYTHON)"
  if ! "$venv/bin/python" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null; then
    say "creating the virtual environment $venv (with $python)"
    rm -rf "$venv"
    "$python" -m venv "$venv" || die "'$python -m venv' failed (on Debian: apt-get install python3-venv)"
  fi
  local stamp=$venv/.octet-requirements want
  want="$(sha256sum <"$requirements" | cut -d' ' -f1) $("$venv/bin/python" -c 'import sys; print(sys.version.split()[0])')"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing python/requirements.txt into $venv (torch and jax: about 5 minutes and 6 GB the first time)"
    rm -f "$stamp"
    "$venv/bin/python" -m pip install --disable-pip-version-check -r "$requirements"
    echo "$want" >"$stamp"
  fi
  export VIRTUAL_ENV=$venv PATH="$venv/bin:$PATH"
}

# A CUDA toolkit in its default place is used even when nvcc is not on PATH (its installer does not
# put it there); CMake's check_language(CUDA) looks on PATH.
find_cuda() {
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="$PATH:/usr/local/cuda/bin"
    say "using the CUDA toolkit in /usr/local/cuda"
  fi
}

# The test preset's build folder (CMakePresets.json) must use .venv's Python. On a folder configured
# before (with another Python, whose find_program result CMake keeps in its cache) or a new one,
# configure once naming it; the workflow's own configure then keeps it.
configure_test() {
  local python=$venv/bin/python3 cache=$root/build/default/CMakeCache.txt
  if [ "${1:-}" = always ] || ! grep -qxF "Python3_EXECUTABLE:FILEPATH=$python" "$cache" 2>/dev/null; then
    cmake --preset default "-DPython3_EXECUTABLE:FILEPATH=$python"
  fi
}

command=${1:-}
[ $# -gt 0 ] && shift
configure_only=0
workflow_args=()
for arg in "$@"; do
  case $arg in
    --configure-only) configure_only=1 ;;
    -h|--help) command=help ;;
    --fresh) workflow_args+=("$arg") ;;
    *) short_usage; die "unknown option '$arg'" ;;
  esac
done
if [ $configure_only = 1 ] && [ "$command" != test ]; then die "--configure-only goes with 'test'"; fi

case $command in
  demo)
    ensure_packages "${demo_packages[@]}"
    exec cmake --workflow --preset demo "${workflow_args[@]}"
    ;;
  test|setup)
    ensure_packages "${test_packages[@]}"
    ensure_venv
    [ "$command" = setup ] && { say "ready: Debian packages and $venv"; exit 0; }
    find_cuda
    if [ $configure_only = 1 ]; then
      configure_test always
      exit 0
    fi
    # --fresh drops the cache; the fresh configure finds .venv's python3 first on PATH.
    [ ${#workflow_args[@]} -eq 0 ] && configure_test
    exec cmake --workflow --preset test "${workflow_args[@]}"
    ;;
  -h|--help|help)
    usage
    ;;
  *)
    short_usage
    exit 2
    ;;
esac
