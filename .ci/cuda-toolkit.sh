#!/usr/bin/env bash
# Complete a wheel-based CUDA toolkit for llamaforge's CUDA probe (tests/test_cuda_arch.py), from PyPI only.
#
# The CI machines carry nvcc 13.0.88 assembled from the PyPI wheels of `cuda-toolkit==13.0.2` but lack cuBLAS
# (ggml-cuda includes <cublas_v2.h> and links CUDA::cublas) and cuobjdump. This installs them with
# `pip install --target` into a cache prefix (no root, nothing outside the prefix is touched), and the compiler
# itself too when no nvcc is found. The libcuda.so stub that CMake wants is made by llamaforge.backends.cuda.probe.
#
# Usage: .ci/cuda-toolkit.sh [ENV_FILE]
#   Prints `export NAME=value` lines, or writes them to ENV_FILE (for `source`, or `>> "$GITHUB_ENV"`-style
#   files: the lines are plain `export NAME=value`).
# Knobs (environment):
#   LLAMAFORGE_CUDA_RELEASE    cuda-toolkit meta-package release whose pins pick the component versions
#                              (default 13.0.2: nvcc 13.0.88, cudart 13.0.96, cuBLAS 13.1.0.3).
#   LLAMAFORGE_CUOBJDUMP_VERSION  nvidia-cuda-cuobjdump wheel (default 13.2.51, the oldest on PyPI: there is
#                              none for 13.0/13.1; a newer cuobjdump reads older cubins).
#   LLAMAFORGE_CUDA_PREFIX     install prefix (default ${XDG_CACHE_HOME:-~/.cache}/llamaforge/cuda-RELEASE).
set -euo pipefail

release="${LLAMAFORGE_CUDA_RELEASE:-13.0.2}"
cuobjdump_version="${LLAMAFORGE_CUOBJDUMP_VERSION:-13.2.51}"
prefix="${LLAMAFORGE_CUDA_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/llamaforge/cuda-$release}"
major="${release%%.*}"
release_minor="${release#*.}"
release_mm="$major.${release_minor%%.*}"
root="$prefix/nvidia/cu$major"
python="${PYTHON:-python3}"

die() {
    printf 'cuda-toolkit.sh: %s\n' "$*" >&2
    exit 1
}

# nvcc's "release X.Y" must match the toolkit release, else the cuBLAS headers would not fit the compiler.
nvcc_release() {
    "$1" --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\),.*/\1/p'
}

# CUDA 12 wheels (-cu12 names) use one nvidia/<component>/ dir each, and cuobjdump has no 12.x wheel.
[ "$major" -ge 13 ] || die "only CUDA 13+ wheels are supported here (LLAMAFORGE_CUDA_RELEASE=$release)"

nvcc="${CUDACXX:-}"
[ -n "$nvcc" ] || nvcc="$(command -v nvcc || true)"
extras="cublas"
if [ -z "$nvcc" ] && [ -x "$root/bin/nvcc" ]; then
    nvcc="$root/bin/nvcc"
fi
if [ -z "$nvcc" ]; then
    # No compiler at all: take it from the same release (nvvm carries cicc, crt/cccl the headers nvcc needs).
    extras="cublas,nvcc,nvvm,crt,cccl,cudart,culibos"
    nvcc="$root/bin/nvcc"
else
    found="$(nvcc_release "$nvcc")"
    [ "$found" = "$release_mm" ] ||
        die "$nvcc is CUDA $found but LLAMAFORGE_CUDA_RELEASE=$release; set LLAMAFORGE_CUDA_RELEASE to the $found.x release of the PyPI package cuda-toolkit that matches it"
fi

if [ -f "$root/include/cublas_v2.h" ] && [ -x "$root/bin/cuobjdump" ] && [ -x "$nvcc" ]; then
    printf 'cuda-toolkit.sh: already installed in %s\n' "$prefix" >&2
else
    mkdir -p "$prefix"
    # The cuda-toolkit meta-package pins each component to its release (13.0.2 -> nvidia-cublas 13.1.0.3.*),
    # so no component version is guessed here.
    "$python" -m pip install --quiet --disable-pip-version-check --upgrade --target "$prefix" \
        "cuda-toolkit[$extras]==$release" "nvidia-cuda-cuobjdump==$cuobjdump_version"
fi

# Wheels carry only versioned sonames (libcudart.so.13): give find_library the unversioned names it searches
# for. nvcc.profile links from TOP/lib64, which the wheels do not have.
for lib in "$root"/lib/lib*.so.*; do
    [ -e "$lib" ] || continue
    base="${lib##*/}"
    [ -e "$root/lib/${base%%.so.*}.so" ] || ln -s "$base" "$root/lib/${base%%.so.*}.so"
done
[ -e "$root/lib64" ] || ln -s lib "$root/lib64"

[ -f "$root/include/cublas_v2.h" ] || die "cublas_v2.h missing under $root/include after install"
[ -x "$root/bin/cuobjdump" ] || die "cuobjdump missing under $root/bin after install"
[ -x "$nvcc" ] || die "nvcc missing: $nvcc"
"$root/bin/cuobjdump" --version >/dev/null || die "$root/bin/cuobjdump does not run"

env_lines="$(printf 'export LLAMAFORGE_CUDA_EXTRAS=%q\nexport CUDACXX=%q' "$root" "$nvcc")"
if [ "$#" -ge 1 ]; then
    printf '%s\n' "$env_lines" >"$1"
    printf 'cuda-toolkit.sh: wrote %s\n' "$1" >&2
else
    printf '%s\n' "$env_lines"
fi
