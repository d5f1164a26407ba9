"""Prove what GPU code a set of llama.cpp CUDA cmake arguments produces, without a GPU.

The probe configures llama.cpp with the caller's cmake arguments verbatim, builds one translation unit of
ggml-cuda through ninja and lists the device code in the object with ``cuobjdump``: the SASS (ELF) images
and the PTX it carries are exactly what ``CMAKE_CUDA_ARCHITECTURES`` asked for, or the flags are wrong.
Compiling one unit takes seconds; the whole ggml-cuda library takes tens of minutes on two cores.

Only the toolkit's location is added to the cmake arguments (compiler path, toolkit root, cuBLAS and a
libcuda stub when they live outside the toolkit, as with PyPI wheel toolkits); those are recorded apart from
the caller's. ``.ci/cuda-toolkit.sh`` installs what a wheel toolkit lacks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamaforge.core.errors import ExitCode, LlamaforgeError, ToolFailed
from llamaforge.runners.process import LOCAL, ProcessRunner

__all__ = [
    "CudaProbeFailed",
    "CudaProbeResult",
    "CudaToolkit",
    "CudaToolkitMissing",
    "compile_cuda_probe",
    "find_cuda_toolkit",
    "make_libcuda_stub",
]

INSTALL_HINT = (
    "run .ci/cuda-toolkit.sh and export what it prints (it pip-installs the cuBLAS wheel of the nvcc "
    "release, e.g. 'cuda-toolkit[cublas]==13.0.2', and 'nvidia-cuda-cuobjdump'), "
    "or install the CUDA toolkit from NVIDIA"
)
EXTRAS_ENV = "LLAMAFORGE_CUDA_EXTRAS"
DEFAULT_UNIT = "fill.cu"
"""Smallest ggml-cuda unit with kernels (two instantiations of one kernel): the quickest real compile to probe."""

_CUDA_OBJECT_DIR = "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir"
_IMAGE_RE = re.compile(r"^(ELF|PTX) file\s+\d+:\s+(\S+)\.(sm_\d+[a-z]?)\.(?:cubin|ptx)$")
_OUTPUT_TAIL_LINES = 30


class CudaToolkitMissing(LlamaforgeError):
    """A tool the CUDA probe needs is not installed; the message says what to install."""

    exit_code = ExitCode.CUDA_TOOLKIT_MISSING


class CudaProbeFailed(ToolFailed):
    """A step of the probe (cmake, ninja, cuobjdump) failed; keeps the command, exit code and output tail."""

    def __init__(self, command: Sequence[str], returncode: int, output: str) -> None:
        """Keep *command*, its exit code and the last lines of its *output*."""
        tail = output.splitlines()[-_OUTPUT_TAIL_LINES:]
        self.output_tail = "\n".join(tail)
        super().__init__(
            f"CUDA probe step failed: {' '.join(command)} exited with {returncode}",
            command=command,
            returncode=returncode,
            tail=tail,
        )


@dataclass(frozen=True)
class CudaToolkit:
    """Where the pieces of a CUDA toolkit are; a wheel toolkit spreads them over several directories."""

    nvcc: Path
    """The real nvcc binary (a wrapper script on PATH is resolved through nvcc's own ``_HERE_``)."""
    root: Path
    version: str
    include_dir: Path
    lib_dir: Path
    cuobjdump: Path | None
    cublas_include_dir: Path | None
    cublas_library: Path | None
    cublaslt_library: Path | None
    libcuda_stub: Path | None
    """An existing ``libcuda.so`` stub; None means :func:`make_libcuda_stub` has to make one."""

    def missing(self) -> list[str]:
        """Name each piece the probe needs that was not found, with the PyPI package that has it."""
        gaps = []
        if self.cuobjdump is None:
            gaps.append("cuobjdump (PyPI: nvidia-cuda-cuobjdump)")
        if self.cublas_include_dir is None or self.cublas_library is None or self.cublaslt_library is None:
            release = self.version.rpartition(".")[0]
            gaps.append(f"cuBLAS headers and libraries for CUDA {release} (PyPI: nvidia-cublas)")
        return gaps

    def require_complete(self) -> None:
        """Raise :class:`CudaToolkitMissing` unless everything the probe needs was found."""
        gaps = self.missing()
        if gaps:
            raise CudaToolkitMissing(
                f"CUDA toolkit {self.version} at {self.root} lacks {'; '.join(gaps)} "
                f"(searched the toolkit, ${EXTRAS_ENV} and nvidia/ in sys.path): {INSTALL_HINT}"
            )

    def cmake_args(self, libcuda_stub: Path) -> list[str]:
        """Return the cmake arguments that point llama.cpp at this toolkit, and nothing else."""
        assert self.cublas_library is not None and self.cublaslt_library is not None
        args = [
            f"-DCMAKE_CUDA_COMPILER={self.nvcc}",
            f"-DCUDAToolkit_ROOT={self.root}",
            # FindCUDAToolkit only searches the toolkit's own lib dirs; a wheel puts cuBLAS elsewhere.
            f"-DCUDA_cublas_LIBRARY={self.cublas_library}",
            f"-DCUDA_cublasLt_LIBRARY={self.cublaslt_library}",
            # ggml-cuda links CUDA::cuda_driver unless GGML_CUDA_NO_VMM, which would change the build.
            f"-DCUDA_cuda_driver_LIBRARY={libcuda_stub}",
        ]
        if not (self.lib_dir / "libcudart.so").exists() and (
            cudart := _find_library([self.lib_dir], "cudart")
        ):
            # pip-installed wheels carry only libcudart.so.N, which find_library(cudart) does not match.
            args += [f"-DCUDA_CUDART={cudart}", f"-DCUDA_cudart_LIBRARY={cudart}"]
        if self.cublas_include_dir is not None and self.cublas_include_dir != self.include_dir:
            # CMake < 3.27 gives CUDA::cublas only the toolkit include dir; ggml-cuda includes <cublas_v2.h>.
            args.append(f"-DCMAKE_CUDA_STANDARD_INCLUDE_DIRECTORIES={self.cublas_include_dir}")
        return args


@dataclass(frozen=True)
class CudaProbeResult:
    """What one ggml-cuda object built with given cmake arguments contains."""

    cmake_args: tuple[str, ...]
    """Exactly the caller's cmake arguments."""
    toolkit_args: tuple[str, ...]
    """What the probe added: generator if none was given, toolkit location."""
    build_dir: Path
    object_file: Path
    nvcc_command: str
    """The compile command ninja ran for the unit (with its launcher, e.g. ccache, if any)."""
    elf_archs: tuple[str, ...]
    """SASS images, e.g. ``("sm_86", "sm_89")``."""
    ptx_archs: tuple[str, ...]
    """PTX images, named as cuobjdump names them, e.g. ``("sm_89",)`` for ``compute_89`` PTX."""
    cuobjdump_lines: tuple[str, ...]
    """The ``ELF file``/``PTX file`` lines of ``cuobjdump --list-elf`` and ``--list-ptx``."""
    configure_seconds: float | None
    """None when an earlier configure with the same arguments was reused."""
    compile_seconds: float


def find_cuda_toolkit(runner: ProcessRunner = LOCAL) -> CudaToolkit | None:
    """Locate nvcc and the pieces the probe needs; None when there is no nvcc at all.

    nvcc is taken from ``$CUDACXX``, ``$CUDAToolkit_ROOT``/``$CUDA_HOME``/``$CUDA_PATH``, PATH or
    /usr/local/cuda. cuBLAS, cuobjdump and a libcuda stub are looked for in the toolkit, then in
    ``$LLAMAFORGE_CUDA_EXTRAS`` (set by .ci/cuda-toolkit.sh), then in ``nvidia/`` wheel directories on
    sys.path. Pieces not found are None; :meth:`CudaToolkit.missing` lists them.
    """
    nvcc = _find_nvcc()
    if nvcc is None:
        return None
    here = _nvcc_home(nvcc, runner)
    root = here.parent
    include_dir = _first_dir_with(
        [root / "include", *sorted(root.glob("targets/*/include"))], "cuda_runtime.h"
    )
    lib_dir = _first_dir_with(
        [root / "lib64", root / "lib", *sorted(root.glob("targets/*/lib"))], "libcudart.so*"
    )
    if include_dir is None or lib_dir is None:
        raise CudaToolkitMissing(
            f"nvcc at {here / 'nvcc'} has no cuda_runtime.h/libcudart next to it: {INSTALL_HINT}"
        )
    version = _nvcc_version(here / "nvcc", runner)
    homes = [root, *_extra_homes(version.partition(".")[0])]

    cublas_include = _first_dir_with([h / "include" for h in homes], "cublas_v2.h")
    lib_dirs = [d for h in homes for d in (h / "lib64", h / "lib")]
    stub_dirs = [d / "stubs" for d in (lib_dir, *lib_dirs)]
    cuobjdump = next((h / "bin" / "cuobjdump" for h in homes if (h / "bin" / "cuobjdump").is_file()), None)
    if cuobjdump is None and (on_path := shutil.which("cuobjdump")) is not None:
        cuobjdump = Path(on_path)
    return CudaToolkit(
        nvcc=here / "nvcc",
        root=root,
        version=version,
        include_dir=include_dir,
        lib_dir=lib_dir,
        cuobjdump=cuobjdump,
        cublas_include_dir=cublas_include,
        cublas_library=_find_library(lib_dirs, "cublas"),
        cublaslt_library=_find_library(lib_dirs, "cublasLt"),
        libcuda_stub=_find_library(stub_dirs, "cuda"),
    )


def make_libcuda_stub(dest_dir: Path, runner: ProcessRunner = LOCAL) -> Path:
    """Make an empty ``libcuda.so`` (soname libcuda.so.1) for configuring without a driver.

    It satisfies CMake's CUDA::cuda_driver and compiling; it has no symbols, so linking a program against it
    fails.
    """
    stub = dest_dir / "libcuda.so"
    if stub.is_file():
        return stub
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise CudaToolkitMissing(
            "no C compiler (cc) to make a libcuda.so stub: install gcc (Debian: build-essential)"
        )
    dest_dir.mkdir(parents=True, exist_ok=True)
    _run(
        [cc, "-shared", "-Wl,-soname,libcuda.so.1", "-o", str(stub), "-x", "c", os.devnull], dest_dir, runner
    )
    return stub


def compile_cuda_probe(
    source_dir: Path,
    cmake_args: Sequence[str],
    work_dir: Path,
    unit: str = DEFAULT_UNIT,
    runner: ProcessRunner = LOCAL,
) -> CudaProbeResult:
    """Configure llama.cpp with *cmake_args*, build one ggml-cuda unit and list the device code it carries.

    *unit* is a path below ``ggml/src/ggml-cuda`` (``fill.cu``, ``template-instances/mmq-instance-q4_0.cu``).
    The build lives in ``work_dir/build``; a second call with the same arguments reuses its configure, other
    arguments start it afresh so that no earlier cache entry survives. Raises :class:`CudaToolkitMissing` when
    nvcc, cuBLAS, cuobjdump, cmake or ninja is missing and :class:`CudaProbeFailed` when a step fails.
    """
    toolkit = find_cuda_toolkit(runner)
    if toolkit is None:
        raise CudaToolkitMissing(
            f"no nvcc found (CUDACXX, CUDAToolkit_ROOT, CUDA_HOME, PATH): {INSTALL_HINT}"
        )
    toolkit.require_complete()
    assert toolkit.cuobjdump is not None
    cmake, ninja = _require_tool("cmake"), _require_tool("ninja")
    generator = _generator(cmake_args)
    if generator not in (None, "Ninja"):
        raise ValueError(
            f"the probe builds one object through ninja; cmake_args ask for generator {generator!r}"
        )

    work_dir = work_dir.resolve()
    stub = toolkit.libcuda_stub or make_libcuda_stub(work_dir / "stubs", runner)
    toolkit_args = ([] if generator else ["-G", "Ninja"]) + toolkit.cmake_args(stub)
    build_dir = work_dir / "build"
    configure_seconds = _configure(
        cmake, source_dir.resolve(), build_dir, list(cmake_args), toolkit_args, runner
    )

    target = f"{_CUDA_OBJECT_DIR}/{unit}.o"
    targets = _run([ninja, "-C", str(build_dir), "-t", "targets", "all"], build_dir, runner)
    if f"\n{target}:" not in f"\n{targets}":
        raise ValueError(f"ggml-cuda has no unit {unit!r} in {source_dir} (no ninja target {target})")
    commands = _run([ninja, "-C", str(build_dir), "-t", "commands", target], build_dir, runner).splitlines()
    started = time.monotonic()
    _run([ninja, "-C", str(build_dir), target], build_dir, runner)
    compile_seconds = time.monotonic() - started

    object_file = build_dir / target
    listing = [
        _run([str(toolkit.cuobjdump), flag, str(object_file)], build_dir, runner)
        for flag in ("--list-elf", "--list-ptx")
    ]
    lines = tuple(
        line.strip() for out in listing for line in out.splitlines() if _IMAGE_RE.match(line.strip())
    )
    return CudaProbeResult(
        cmake_args=tuple(cmake_args),
        toolkit_args=tuple(toolkit_args),
        build_dir=build_dir,
        object_file=object_file,
        nvcc_command=commands[-1] if commands else "",
        elf_archs=_archs(lines, "ELF"),
        ptx_archs=_archs(lines, "PTX"),
        cuobjdump_lines=lines,
        configure_seconds=configure_seconds,
        compile_seconds=compile_seconds,
    )


def _configure(
    cmake: str,
    source_dir: Path,
    build_dir: Path,
    cmake_args: list[str],
    toolkit_args: list[str],
    runner: ProcessRunner,
) -> float | None:
    """Run cmake unless build_dir was configured with the same inputs; return its wall time."""
    stamp = build_dir / "llamaforge-probe.json"
    inputs = {"source_dir": str(source_dir), "cmake_args": cmake_args, "toolkit_args": toolkit_args}
    if (build_dir / "build.ninja").is_file() and stamp.is_file() and json.loads(stamp.read_text()) == inputs:
        return None
    if build_dir.exists():
        shutil.rmtree(build_dir)
    build_dir.mkdir(parents=True)
    started = time.monotonic()
    _run([cmake, "-S", str(source_dir), "-B", str(build_dir), *toolkit_args, *cmake_args], build_dir, runner)
    elapsed = time.monotonic() - started
    stamp.write_text(json.dumps(inputs, indent=2) + "\n")
    return elapsed


def _run(command: Sequence[str], cwd: Path, runner: ProcessRunner) -> str:
    """Run a command, return its stdout; raise CudaProbeFailed with the output tail on failure."""
    proc = runner.run(command, cwd=cwd, warn=True)
    if proc.exit_code != 0:
        raise CudaProbeFailed(command, proc.exit_code, proc.stdout + proc.stderr)
    return proc.stdout


def _require_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise CudaToolkitMissing(f"{name} not found on PATH: install it (PyPI: {name}; Debian: {name})")
    return found


def _generator(cmake_args: Sequence[str]) -> str | None:
    for i, arg in enumerate(cmake_args):
        if arg == "-G" and i + 1 < len(cmake_args):
            return cmake_args[i + 1]
        if arg.startswith("-G") and len(arg) > 2:
            return arg[2:]
    return None


def _find_nvcc() -> Path | None:
    candidates: list[Path] = []
    if cudacxx := os.environ.get("CUDACXX"):
        candidates.append(Path(cudacxx))
    roots = (os.environ.get(var) for var in ("CUDAToolkit_ROOT", "CUDA_HOME", "CUDA_PATH"))
    candidates.extend(Path(root) / "bin" / "nvcc" for root in roots if root)
    if on_path := shutil.which("nvcc"):
        candidates.append(Path(on_path))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    candidates.extend(home / "bin" / "nvcc" for home in _extra_homes("*"))
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def _nvcc_home(nvcc: Path, runner: ProcessRunner) -> Path:
    """Return the bin directory nvcc runs from: nvcc on PATH is often a wrapper script or a symlink."""
    proc = runner.run(
        [str(nvcc), "--dryrun", "-v", "-x", "cu", "-c", os.devnull, "-o", os.devnull], warn=True
    )
    match = re.search(r"^#\$ _HERE_=(.+)$", proc.stdout + proc.stderr, re.MULTILINE)
    return Path(match.group(1)).resolve() if match else nvcc.resolve().parent


def _nvcc_version(nvcc: Path, runner: ProcessRunner) -> str:
    out = runner.run([str(nvcc), "--version"], warn=True).stdout
    match = re.search(r"\bV(\d+\.\d+\.\d+)", out)
    if match is None:
        raise CudaToolkitMissing(f"{nvcc} --version printed no version: {INSTALL_HINT}")
    return match.group(1)


def _extra_homes(major: str) -> Iterator[Path]:
    """Directories laid out like a toolkit root: $LLAMAFORGE_CUDA_EXTRAS, then pip's nvidia/ wheel dirs."""
    if extras := os.environ.get(EXTRAS_ENV):
        yield Path(extras)
    for entry in sys.path:
        nvidia = Path(entry or ".") / "nvidia"
        if nvidia.is_dir():
            # CUDA 13 wheels share nvidia/cu13; CUDA 12 wheels use one dir per component.
            yield from sorted(nvidia.glob(f"cu{major}"))
            yield from (
                nvidia / name
                for name in ("cublas", "cuda_cuobjdump", "cuda_nvcc")
                if (nvidia / name).is_dir()
            )


def _first_dir_with(dirs: Sequence[Path], pattern: str) -> Path | None:
    return next((d for d in dirs if d.is_dir() and any(d.glob(pattern))), None)


def _find_library(dirs: Sequence[Path], name: str) -> Path | None:
    """lib<name>.so, else a versioned lib<name>.so.N (wheels carry no unversioned symlink)."""
    for d in dirs:
        if (d / f"lib{name}.so").is_file():
            return d / f"lib{name}.so"
        versioned = sorted(d.glob(f"lib{name}.so.*"))
        if versioned:
            return versioned[0]
    return None


def _archs(lines: Sequence[str], kind: str) -> tuple[str, ...]:
    found = {m.group(3) for line in lines if (m := _IMAGE_RE.match(line)) and m.group(1) == kind}
    return tuple(sorted(found, key=lambda a: (int(re.sub(r"\D", "", a)), a)))
