"""One way to start llama.cpp: the llama-server / llama-cli argv builder and the llama-server launcher.

:class:`LlamaFlags` turns the options llamaforge sets into llama.cpp flags (the fit planner's recommended
command, the smoke server, the fit measurement and the verify load check all use it). :class:`LlamaServer`
starts llama-server through a :class:`~llamaforge.runners.process.ProcessRunner`, on loopback by default: it
picks a free port (and moves on when one turns out busy), waits for ``/health`` to answer 200 (503 while the
model loads), checks that the server answering is the one it started, and always stops it (normal exit,
failure, timeout, cancel, Ctrl-C); its log stays where the caller asked.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator

from llamaforge.core.errors import SmokeFailed, ToolFailed
from llamaforge.core.events import CancelToken, Event, Reporter, null_reporter
from llamaforge.core.validation import suggest
from llamaforge.runners.process import LOCAL, ProcessHandle, ProcessRunner

HOST = "127.0.0.1"  # loopback by default: nothing is exposed unless a caller asks
DEFAULT_RPC_PORT = 50052  # ggml-rpc-server's default port (tools/rpc)
PORT_ATTEMPTS = 5
_BIND_FAILURE = "couldn't bind"
_LOADED = "model loaded"
Switch = Literal["on", "off", "auto"]


#: The KV cache types llama.cpp b11312 accepts for ``-ctk`` / ``-ctv``.
CACHE_TYPES: Final = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def check_cache_type(value: str) -> str:
    """``value`` when llama.cpp knows it as a KV cache type; a ValueError with "did you mean" otherwise."""
    if value not in CACHE_TYPES:
        close = suggest(value, CACHE_TYPES, end=" ")
        raise ValueError(
            f"{value!r} is not a KV cache type llama.cpp knows; {close}known: {', '.join(CACHE_TYPES)}"
        )
    return value


#: A KV cache type parameter (``-ctk`` / ``-ctv``), checked where it is given, so the error names that option.
CacheType = Annotated[str, AfterValidator(check_cache_type)]


@dataclass(frozen=True)
class LlamaFlags:
    """llama.cpp options shared by llama-server and llama-cli; None leaves llama.cpp's default."""

    n_gpu_layers: int | None = None
    n_cpu_moe: int | None = None
    ctx: int | None = None  # total context (all slots)
    parallel: int | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    flash_attn: Switch | None = None
    ubatch: int | None = None
    batch: int | None = None
    threads: int | None = None
    threads_batch: int | None = None
    fit: Switch | None = None
    warmup: bool = True
    kv_unified: bool | None = None
    swa_full: bool = False  # --swa-full: full-size caches for sliding-window layers
    log_verbosity: int | None = None  # -lv N
    verbose: bool = False  # -v: the whole load log
    rpc: tuple[str, ...] | None = None  # --rpc host:port,... (ggml-rpc workers, in device order)
    tensor_split: tuple[float, ...] | None = None  # -ts: one proportion per device
    # --no-repack when False: CPU-resident weights stay in plain buffers, out of the CPU's extra buffer types
    # (CPU_REPACK, AMX), whose kernels and sizes depend on the CPU the binary runs on.
    repack: bool = True
    # llama-server flags given as they are (--server-args), last on the command line; checked against the
    # build's own `llama-server --help` by llamaforge.serve.server_args before they get here.
    extra: tuple[str, ...] = ()

    def args(self) -> list[str]:
        """The flags, in a stable order."""
        valued = (
            ("-ngl", self.n_gpu_layers),
            ("--n-cpu-moe", self.n_cpu_moe),
            ("-c", self.ctx),
            ("--parallel", self.parallel),
            ("-ctk", self.cache_type_k),
            ("-ctv", self.cache_type_v),
            ("-fa", self.flash_attn),
            ("-ub", self.ubatch),
            ("-b", self.batch),
            ("-t", self.threads),
            ("-tb", self.threads_batch),
            ("-fit", self.fit),
            ("-lv", self.log_verbosity),
        )
        args = [part for flag, value in valued if value is not None for part in (flag, str(value))]
        if self.rpc:
            args += ["--rpc", ",".join(self.rpc)]
        if self.tensor_split:
            args += ["-ts", ",".join(f"{value:g}" for value in self.tensor_split)]
        if not self.warmup:
            args.append("--no-warmup")
        if self.kv_unified is not None:
            args.append("--kv-unified" if self.kv_unified else "--no-kv-unified")
        if self.swa_full:
            args.append("--swa-full")
        if not self.repack:
            args.append("--no-repack")
        if self.verbose:
            args.append("-v")
        return [*args, *self.extra]


#: The flag each field of :class:`LlamaFlags` writes (a switch: the one it writes when set).
FIELD_FLAGS: Final = {
    "n_gpu_layers": "-ngl",
    "n_cpu_moe": "--n-cpu-moe",
    "ctx": "-c",
    "parallel": "--parallel",
    "cache_type_k": "-ctk",
    "cache_type_v": "-ctv",
    "flash_attn": "-fa",
    "ubatch": "-ub",
    "batch": "-b",
    "threads": "-t",
    "threads_batch": "-tb",
    "fit": "-fit",
    "log_verbosity": "-lv",
    "rpc": "--rpc",
    "tensor_split": "-ts",
    "warmup": "--no-warmup",
    "kv_unified": "--kv-unified",
    "swa_full": "--swa-full",
    "repack": "--no-repack",
    "verbose": "-v",
}
#: The flags :func:`server_argv` writes on every llama-server command line.
SERVER_FLAGS: Final = ("-m", "--host", "--port", "--no-webui")


def server_argv(binary: Path, model: Path, flags: LlamaFlags, *, port: int, host: str = HOST) -> list[str]:
    """The llama-server command line: ``model`` on ``host:port``, without the web UI."""
    return [str(binary), "-m", str(model), "--host", host, "--port", str(port), "--no-webui", *flags.args()]


def cli_argv(binary: Path, model: Path, flags: LlamaFlags, *, prompt: str, n_predict: int) -> list[str]:
    """The llama-cli command line for one single-turn prompt with plain output."""
    return [
        str(binary),
        "-m",
        str(model),
        "-n",
        str(n_predict),
        "-p",
        prompt,
        "-st",
        "--simple-io",
        *flags.args(),
    ]


def port_is_free(port: int, host: str = HOST) -> bool:
    """True when nothing listens on ``host:port`` (we can bind it ourselves)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    """A port the kernel says is free now (another process may still take it before the server binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def request_json(
    port: int, method: str, path: str, body: dict[str, Any] | None = None, *, timeout: float, host: str = HOST
) -> tuple[int, dict[str, Any]]:
    """One small HTTP request to a server: (status, parsed JSON or {}); status 0 when unreachable."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        connection.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        raw = response.read()
        try:
            data = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            data = {}
        return response.status, data if isinstance(data, dict) else {"data": data}
    except (OSError, http.client.HTTPException):
        return 0, {}
    finally:
        connection.close()


@dataclass(frozen=True)
class ServerLaunch:
    """How to start llama-server: binary, model, flags, where its log goes and how long it may load."""

    binary: Path
    model: Path
    flags: LlamaFlags
    log_path: Path
    port: int | None = None  # None: any free port
    host: str = HOST
    load_timeout_s: float = 300.0


class LlamaServer:
    """A llama-server process; a context manager that always stops it."""

    def __init__(
        self,
        launch: ServerLaunch,
        reporter: Reporter = null_reporter,
        cancel: CancelToken | None = None,
        runner: ProcessRunner = LOCAL,
    ) -> None:
        self.launch = launch
        self.reporter = reporter
        self.cancel = cancel or CancelToken()
        self.runner = runner
        self.process: ProcessHandle | None = None
        self.port = 0
        self.pid = 0
        self.startup_s = 0.0
        self.command: list[str] = []
        self.busy_ports: list[int] = []
        self.load_log: list[str] = []  # the output of the process that became ready

    def __enter__(self) -> LlamaServer:
        try:
            self.start()
        except BaseException:
            self.stop(grace_s=0.0)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # After a failure, cancel or Ctrl-C nothing is worth waiting for: a busy server can take seconds to
        # finish the request in flight after SIGTERM.
        self.stop(grace_s=0.0 if exc_type is not None else 5.0)

    def start(self) -> None:
        """Start the server and wait until it serves the model; try other ports when one is busy."""
        requested = self.launch.port
        started = time.monotonic()
        for _attempt in range(PORT_ATTEMPTS):
            port = requested if requested is not None else free_port(self.launch.host)
            requested = None
            if not port_is_free(port, self.launch.host):
                self._busy(port)
                continue
            if self._launch(port):
                self.startup_s = time.monotonic() - started
                self.load_log = self._load_log()
                return
            self._busy(port)
        raise SmokeFailed(
            f"llama-server found no free port in {PORT_ATTEMPTS} attempts (busy: {self.busy_ports})",
            hint=f"something keeps taking ports on {self.launch.host}; see {self.launch.log_path}",
        )

    def _busy(self, port: int) -> None:
        self.busy_ports.append(port)
        self.reporter(
            Event("warning", f"port {port} on {self.launch.host} is busy; trying another", stage="server")
        )

    def _launch(self, port: int) -> bool:
        """Start on ``port``; True once ready, False when the port was taken under us (the process is gone)."""
        launch = self.launch
        self.command = server_argv(launch.binary, launch.model, launch.flags, port=port, host=launch.host)
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        with launch.log_path.open("a", encoding="utf-8") as log:
            log.write(f"### llamaforge: {' '.join(self.command)}\n")
        self.cancel.raise_if_cancelled()
        process = self.runner.start(self.command, log_path=launch.log_path, cancel=self.cancel)
        self.process, self.port, self.pid = process, port, process.pid
        self.reporter(
            Event("info", f"llama-server pid {self.pid} loading on {launch.host}:{port}", stage="server")
        )
        deadline = time.monotonic() + launch.load_timeout_s
        while True:
            self.cancel.raise_if_cancelled()
            code = process.poll()
            if code is not None:
                process.wait()
                tail = process.tail()
                if any(_BIND_FAILURE in line for line in tail):
                    return False
                raise ToolFailed(
                    f"llama-server exited with code {code} before it was ready",
                    command=self.command,
                    returncode=code,
                    tail=tail,
                    log_path=str(launch.log_path),
                    hint="the log says why: e.g. a model file llama.cpp cannot load, or not enough memory",
                ).as_crash("llama-server", process.lines(timeout_s=0), when="before it was ready")
            if time.monotonic() > deadline:
                raise SmokeFailed(
                    f"llama-server was not ready within {launch.load_timeout_s:.0f} s (it was stopped)",
                    hint=f"raise --load-timeout-s for big models; log: {launch.log_path}",
                )
            if self._ready():
                return True
            time.sleep(0.1)

    def _load_log(self) -> list[str]:
        """What the server printed up to its "model loaded" line (the reader may lag a moment behind /health)."""
        assert self.process is not None
        lines: list[str] = []
        for line in self.process.lines(timeout_s=2.0):
            lines.append(line)
            if _LOADED in line:
                break
        return lines

    def _ready(self) -> bool:
        host = self.launch.host
        status, _ = request_json(self.port, "GET", "/health", timeout=2.0, host=host)
        if status != 200:  # 503 while the model loads
            return False
        # Make sure the server answering is ours and serves our model, not another one on a reused port.
        status, props = request_json(self.port, "GET", "/props", timeout=5.0, host=host)
        if status != 200 or self.process is None or self.process.poll() is not None:
            return False
        served = str(props.get("model_path", ""))
        if served != str(self.launch.model):
            raise SmokeFailed(
                f"the server on {host}:{self.port} serves {served!r}, not {self.launch.model}",
                hint="another llama-server took the port; run it again",
            )
        return True

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the server (SIGTERM, SIGKILL after ``grace_s``; at once for 0); idempotent."""
        process, self.process = self.process, None
        if process is not None:
            process.terminate(grace_s)
