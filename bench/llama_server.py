"""llama.cpp's own ``llama-server``, built from the llama-cpp-python source distribution.

    .venv/bin/python bench/llama_server.py [--version X.Y.Z]   (build only, print the path)

The benchmark compares lmsp with the server a user would otherwise pick. To compare like
with like it builds the llama.cpp that the installed llama-cpp-python vendors (the sdist
carries ``vendor/llama.cpp`` with ``tools/server``), once, into a cache directory
(``LMSP_BENCH_CACHE``, default ``~/.cache/lmsp-bench``), and starts it on the same GGUF
file with the same thread count.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("LMSP_BENCH_CACHE") or str(Path.home() / ".cache" / "lmsp-bench")
    return Path(base)


def installed_version() -> str:
    from importlib.metadata import version

    return version("llama-cpp-python")


def binary_path(version: str) -> Path:
    return cache_dir() / f"llama-cpp-python-{version}" / "build" / "bin" / "llama-server"


def _log(message: str) -> None:
    print(f"[llama-server] {message}", file=sys.stderr, flush=True)


def source_tree(version: str) -> Path:
    """The unpacked sdist of llama-cpp-python ``version`` (downloaded when missing)."""
    root = cache_dir() / f"llama-cpp-python-{version}"
    if (root / "vendor" / "llama.cpp" / "tools" / "server").is_dir():
        return root
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    archive = downloads / f"llama_cpp_python-{version}.tar.gz"
    if not archive.exists():
        _log(f"downloading the llama-cpp-python {version} source distribution")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-binary",
                ":all:",
                "--no-deps",
                "-d",
                str(downloads),
                f"llama-cpp-python=={version}",
            ],
            check=True,
        )
        found = sorted(downloads.glob(f"llama_cpp_python-{version}.tar.gz")) + sorted(
            downloads.glob(f"llama-cpp-python-{version}.tar.gz")
        )
        if not found:
            raise RuntimeError(f"pip download left no sdist of {version} in {downloads}")
        archive = found[0]
    _log(f"unpacking {archive.name}")
    staging = cache_dir() / f".unpack-{version}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(staging, filter="data")
    (top,) = list(staging.iterdir())
    if root.exists():
        shutil.rmtree(root)
    top.rename(root)
    shutil.rmtree(staging, ignore_errors=True)
    if not (root / "vendor" / "llama.cpp" / "tools" / "server").is_dir():
        raise RuntimeError(f"{root} has no vendor/llama.cpp/tools/server")
    return root


class BuildError(RuntimeError):
    """llama-server could not be fetched or built; the message says why and where the
    build's output is."""


def _run_logged(args: list[str], log: Path, what: str) -> None:
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(args)}\n".encode())
        out.flush()
        done = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-25:]
        raise BuildError(
            f"{what} failed (exit {done.returncode}); the last lines of {log}:\n" + "\n".join(tail)
        )


def ensure_built(version: str | None = None, jobs: int = 2) -> Path:
    """The path of a built ``llama-server`` for ``version`` (the installed one by default),
    building it first when it is not in the cache (10-45 minutes on two cores). Raises
    :class:`BuildError` with a readable reason when that fails."""
    version = version or installed_version()
    binary = binary_path(version)
    if binary.exists():
        return binary
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise BuildError(
            f"{' and '.join(missing)} not found: building llama-server needs cmake and a"
            " C++ compiler (Debian: apt-get install cmake g++)"
        )
    try:
        root = source_tree(version)
    except (subprocess.CalledProcessError, OSError, tarfile.TarError, RuntimeError) as exc:
        raise BuildError(f"could not fetch the llama-cpp-python {version} sdist: {exc}") from exc
    source = root / "vendor" / "llama.cpp"
    build = root / "build"
    log = cache_dir() / f"build-{version}.log"
    started = time.perf_counter()
    _log(f"configuring llama.cpp from llama-cpp-python {version} in {build} (output: {log})")
    _run_logged(
        [
            "cmake",
            "-S",
            str(source),
            "-B",
            str(build),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_BUILD_TOOLS=ON",
            "-DLLAMA_BUILD_SERVER=ON",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DBUILD_SHARED_LIBS=OFF",
        ],
        log,
        "configuring llama.cpp",
    )
    _log(f"building llama-server with -j{jobs} (10-45 minutes on two cores)")
    _run_logged(
        ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
        log,
        "building llama-server",
    )
    if not binary.exists():
        raise BuildError(f"the build finished without {binary}; see {log}")
    _log(f"built in {time.perf_counter() - started:.0f} s: {binary}")
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


#: llama-server's own defaults (weight repacking on, flash attention auto)
DEFAULT_FLAGS: tuple[str, ...] = ()
#: the kernels lmsp runs: no weight repacking (llama.cpp's "extra buffer types": lmsp
#: loads its model with use_extra_bufts = False; on CPUs with AMX the AMX extra buffer
#: type's matmul crashes, which this also avoids) and flash attention on
FAST_FLAGS: tuple[str, ...] = ("--no-repack", "-fa", "on")


class LlamaServer:
    """A running ``llama-server`` on the given GGUF, on a free local port."""

    def __init__(
        self,
        binary: Path,
        model: Path,
        *,
        threads: int,
        parallel: int,
        n_ctx: int,
        log: Path,
        cache_prompt: bool = True,
        flags: tuple[str, ...] = FAST_FLAGS,
        extra: tuple[str, ...] = (),
        cpus: frozenset[int] | None = None,
    ) -> None:
        self.port = free_port()
        self.cpus = cpus  # the cores it may run on (all when None)
        self.url = f"http://127.0.0.1:{self.port}"
        # llama-server splits n_ctx between its slots: give each slot the context lmsp has
        self.args = [
            str(binary),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "-np",
            str(parallel),
            "-c",
            str(n_ctx * parallel),
            "--no-webui",
            *flags,
        ]
        self.args += list(extra)
        if not cache_prompt:
            self.args.append("--no-cache-prompt")
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> LlamaServer:
        import httpx

        out = self.log.open("ab")
        cpus = self.cpus
        pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
        self.proc = subprocess.Popen(
            self.args, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pin
        )
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"llama-server exited {self.proc.returncode}:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("llama-server did not become healthy")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def rss(self) -> int:
        """Resident memory of the server process, bytes."""
        assert self.proc is not None
        return rss_of(self.proc.pid)


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def running(binary: Path, model: Path, **kwargs: object) -> Iterator[LlamaServer]:
    server = LlamaServer(binary, model, **kwargs).start()  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="build llama-server for the benchmarks")
    parser.add_argument("--version", default=None, help="llama-cpp-python version")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    print(ensure_built(args.version, args.jobs))


if __name__ == "__main__":
    main()
