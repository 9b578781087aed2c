"""llama.cpp's CUDA backend on a GPU machine without network: build the pinned
llama-cpp-python for that GPU's architecture only, write random-weight GGUF models of the
default pool's shapes, and profile them with every layer offloaded.

    python scripts/gpu_llamacpp.py trim SDIST DEST     # `make gpu-source`, where there is network
    python scripts/gpu_llamacpp.py run [--out DIR]     # on the GPU machine

`make gpu-source` fills .gpu-source/ (bring it along with the working tree): the pinned
source release, sha256-checked, then trimmed by `trim` to what its build and this script
read; and the wheels its build and import need (scikit-build-core and its dependencies,
cmake and ninja for a machine without them, diskcache).

`run`, each step under its own time limit; the result, OUT/gpu_llamacpp.json, is rewritten
after every step, so a run cut short keeps what it found:
1. nvcc: on PATH, else in $CUDA_HOME/bin where that is set, else in /usr/local/cuda/bin.
   Without one the result says so and the script exits 0: nothing can be built here.
2. the GPU (nvidia-smi's compute capability, else torch's) and the source release;
3. the toolkit: its cuBLAS, else that of Python's nvidia packages (what a CUDA build of
   torch installs), and the driver library (without one to link, VMM is left out);
4. build (OUT/llamacpp_build.log): `pip install --no-index --target WORK/llama` with
   CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=<arch>", skipped when WORK/llama
   holds this source's build with these arguments already (a build cut short resumes in its
   CMake folder, WORK/cmake, on the next run); llama_cpp imported from there must report GPU
   offload;
5. models (OUT/llamacpp_models.log): scripts/random_gguf.py for each shape, with the Qwen2
   tokenizer of the source's vocabulary file and its gguf-py;
6. profile (OUT/llamacpp_profile.log): `specrouter profile --gpu-layers -1 --force`, the
   table in OUT/llamacpp_cuda_profile.json (the router's cost-profile format).
Exit 0 when profiled or without nvcc, 1 when a step failed ("result" and "reason" say which
and why, "log_tail" ends its log). Only the standard library is imported here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / ".gpu-source"
WORK = ROOT / "build" / "gpu-llamacpp"
MODELS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
#: What `trim` leaves out of the source release, under its vendor/llama.cpp/: never read by its
#: build (a subproject builds no tests, tools or examples) nor by this script. Plus every .git.
TRIMMED = ("docs/", "benches/", "models/", "tools/ui/")
#: Kept from TRIMMED: the Qwen2 tokenizer the random models take.
VOCAB = "models/ggml-vocab-qwen2.gguf"
#: ggml's CPU code built without Intel AMX (the Makefile's LLAMA_CFLAGS, and why).
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" if platform.machine() == "x86_64" else ""
#: Where a system keeps cuBLAS and the driver library beside (or instead of) a toolkit.
SYSTEM_INCLUDES = ("/usr/include",)
SYSTEM_LIBS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")


def trim(sdist: Path, dest: Path) -> Path:
    """Copy the source release into `dest` without what TRIMMED names (VOCAB kept)."""
    out = dest / sdist.name
    with tarfile.open(sdist) as src, tarfile.open(out.with_name(out.name + ".part"), "w:gz") as dst:
        for member in src:
            inner = member.name.split("/", 1)[1] if "/" in member.name else ""
            vendored = inner.removeprefix("vendor/llama.cpp/") if inner.startswith("vendor/llama.cpp/") else None
            if ".git" in Path(member.name).parts or (
                    vendored is not None and vendored.startswith(TRIMMED) and vendored != VOCAB):
                continue
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    out.with_name(out.name + ".part").replace(out)
    return out


@dataclass
class Step:
    """A command's exit status (124: over its time limit) and its seconds."""

    rc: int
    seconds: float


def run_step(cmd: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> Step:
    """Run `cmd` into `log`; past `timeout` its whole process group is killed (a build's
    compilers with it) and the status is 124."""
    start = time.monotonic()
    with open(log, "ab") as out:
        out.write(f"$ {' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = 124
    return Step(rc, round(time.monotonic() - start, 1))


def tail(log: Path, lines: int = 30) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def find_nvcc() -> tuple[Path | None, list[str]]:
    """nvcc and the places looked in (PATH, then $CUDA_HOME/bin or /usr/local/cuda/bin)."""
    home = os.environ.get("CUDA_HOME")
    places = ["PATH", f"{home}/bin" if home else "/usr/local/cuda/bin"]
    found = shutil.which("nvcc") or shutil.which("nvcc", path=places[1])
    return (Path(found) if found else None), places


def gpu(python: str) -> tuple[str, str] | None:
    """(name, architecture such as "90") of the first GPU: nvidia-smi's, else torch's."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        name, cap = out.stdout.splitlines()[0].rsplit(",", 1)
        return name.strip(), cap.strip().replace(".", "")
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        pass
    code = ("import torch; p = torch.cuda.get_device_properties(0); "
            "print(f'{p.name},{p.major}{p.minor}') if torch.cuda.is_available() else None")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        name, arch = out.stdout.strip().rsplit(",", 1)
        return name, arch
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


@dataclass
class Toolkit:
    """What the build needs beyond the toolkit's defaults: CMake arguments, compiler flags,
    and library folders the built library must find at run time."""

    top: str | None = None
    cublas: str = "missing"  # "toolkit", "python", or "missing" (the build then fails, saying so)
    driver: str = "missing"  # "found", a libcuda.so.1 named to CMake, or "missing" (no VMM)
    cmake: list[str] = field(default_factory=list)
    includes: list[str] = field(default_factory=list)
    libraries: list[str] = field(default_factory=list)


def _first(dirs: list[Path], pattern: str) -> Path | None:
    for d in dirs:
        hits = sorted(d.glob(pattern))
        if hits:
            return hits[0]
    return None


def probe_toolkit(nvcc: Path, python: str, system_includes=SYSTEM_INCLUDES, system_libs=SYSTEM_LIBS) -> Toolkit:
    """Where cuBLAS and the driver library are, as the build will look for them."""
    kit = Toolkit()
    out = subprocess.run([str(nvcc), "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True, timeout=60)
    tops = [line.split("=", 1)[1] for line in (out.stdout + out.stderr).splitlines() if line.startswith("#$ TOP=")]
    top = Path(tops[0]).resolve() if tops else nvcc.resolve().parent.parent
    kit.top = str(top)
    includes = [top / "include", *top.glob("targets/*/include"), *map(Path, system_includes)]
    libs = [top / "lib64", top / "lib", *top.glob("targets/*/lib"), *map(Path, system_libs)]
    if _first(includes, "cublas_v2.h") and _first(libs, "libcublas.so*"):
        kit.cublas = "toolkit"
    else:
        found = subprocess.run([python, "-c", "import nvidia; print('\\n'.join(nvidia.__path__))"],
                               capture_output=True, text=True, timeout=60).stdout.split()
        roots = [Path(p) for p in found]
        header = next((h for r in roots for h in sorted(r.rglob("cublas_v2.h"))), None)
        lib = next((h for r in roots for h in sorted(r.rglob("libcublas.so*"))), None)
        lt = next((h for r in roots for h in sorted(r.rglob("libcublasLt.so*"))), None)
        if header and lib and lt:
            kit.cublas = "python"
            kit.cmake += [f"-DCUDA_cublas_LIBRARY={lib}", f"-DCUDA_cublasLt_LIBRARY={lt}"]
            kit.includes.append(str(header.parent))
            kit.libraries.append(str(lib.parent))
    stubs = [top / "lib64" / "stubs", *top.glob("targets/*/lib/stubs")]
    if _first(stubs + [Path(d) for d in system_libs], "libcuda.so"):
        kit.driver = "found"
    elif (driver := _first([Path(d) for d in system_libs], "libcuda.so.1")) is not None:
        kit.driver = str(driver)
        kit.cmake.append(f"-DCUDA_cuda_driver_LIBRARY={driver}")
    else:
        kit.cmake.append("-DGGML_CUDA_NO_VMM=ON")
    return kit


class Run:
    """One `run`: the result so far, written to OUT/gpu_llamacpp.json after every change."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.out, self.work = args, args.out, args.work
        self.result: dict = {"result": "running"}
        self.out.mkdir(parents=True, exist_ok=True)

    def note(self, **values) -> None:
        self.result.update(values)
        (self.out / "gpu_llamacpp.json").write_text(json.dumps(self.result, indent=1) + "\n")

    def stop(self, result: str, reason: str, log: Path | None = None, status: int = 1) -> int:
        self.note(result=result, reason=reason, **({"log_tail": tail(log)} if log else {}))
        print(f"gpu_llamacpp: {result}: {reason}")
        return status

    def env(self, kit: Toolkit | None, paths: tuple[Path, ...] = (), **extra: str) -> dict[str, str]:
        """This process's environment with `extra`, `paths` before its PYTHONPATH, and the
        toolkit's library folders before its LD_LIBRARY_PATH."""
        env = {**os.environ, **extra}
        for name, dirs in (("PYTHONPATH", list(map(str, paths))), ("LD_LIBRARY_PATH", kit.libraries if kit else [])):
            if dirs:
                env[name] = os.pathsep.join([*dirs, *filter(None, [env.get(name)])])
        return env

    def main(self) -> int:
        nvcc, places = find_nvcc()
        if nvcc is None:
            return self.stop("no-nvcc", f"no nvcc on {' or in '.join(places)}: llama.cpp's CUDA backend cannot be "
                                        "built here", status=0)
        release = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
        self.note(nvcc=str(nvcc), cuda=next((line.split("release", 1)[1].strip() for line in release.splitlines()
                                             if "release" in line), None))
        device = gpu(self.args.python)
        if device is None:
            return self.stop("no-gpu", "neither nvidia-smi nor torch sees a GPU")
        self.note(gpu=device[0], arch=device[1])
        sdists = sorted(self.args.source.glob("llama_cpp_python-*.tar.gz"))
        if not sdists:
            return self.stop("no-source", f"no llama_cpp_python-*.tar.gz in {self.args.source}: run `make gpu-source` "
                                          "where there is network and bring that folder along")
        sdist = sdists[-1]
        self.note(source=sdist.name, source_sha256=hashlib.sha256(sdist.read_bytes()).hexdigest())
        kit = probe_toolkit(nvcc, self.args.python)
        self.note(toolkit={"top": kit.top, "cublas": kit.cublas, "driver": kit.driver})
        tree = self.source_tree(sdist)
        target = self.build(tree, nvcc, device[1], kit)
        if target is None:
            return 1
        models = self.models(tree)
        if models is None:
            return 1
        return self.profile(target, models, kit)

    def source_tree(self, sdist: Path) -> Path:
        """The release unpacked in WORK/source (kept while its sha256 matches), with its CMake
        build folder WORK/cmake: a build cut short by its time limit goes on from where it
        stopped in the next run on the same machine."""
        source, sha = self.work / "source", self.result["source_sha256"]
        stamp = source / ".sha256"
        if not (stamp.is_file() and stamp.read_text() == sha):
            shutil.rmtree(source, ignore_errors=True)
            shutil.rmtree(self.work / "cmake", ignore_errors=True)
            with tarfile.open(sdist) as tar:
                tar.extractall(source, filter="data")
            stamp.write_text(sha)
        return next(p for p in source.iterdir() if p.is_dir())

    def build(self, tree: Path, nvcc: Path, arch: str, kit: Toolkit) -> Path | None:
        """WORK/llama: the source built for `arch` (reused when its stamp matches); None on failure."""
        target, log = self.work / "llama", self.out / "llamacpp_build.log"
        cmake = ["-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={arch}", f"-DCMAKE_CUDA_COMPILER={nvcc}", *kit.cmake]
        flags = " ".join([NO_AMX, *(f"-I{d}" for d in kit.includes)]).strip()
        if kit.includes:
            cmake.append("-DCMAKE_CUDA_FLAGS=" + " ".join(f"-I{d}" for d in kit.includes))
        stamp = {"source_sha256": self.result["source_sha256"], "cmake_args": cmake, "cflags": flags}
        self.note(cmake_args=" ".join(cmake))
        stamp_file = target / ".specrouter-build.json"
        reused = stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp
        if not reused:
            shutil.rmtree(target, ignore_errors=True)
            wheels = sorted(self.args.source.glob("diskcache-*.whl"))
            env = self.env(kit, CMAKE_ARGS=" ".join(cmake), CFLAGS=flags, CXXFLAGS=flags, PIP_NO_INPUT="1",
                           PIP_DISABLE_PIP_VERSION_CHECK="1",
                           CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 1))
            step = run_step([self.args.python, "-m", "pip", "install", "-v", "--no-index", "--find-links",
                             str(self.args.source), "--no-deps", "--no-cache-dir", "--target", str(target),
                             f"--config-settings=build-dir={self.work / 'cmake'}", str(tree), *map(str, wheels)],
                            log, self.args.build_timeout, env)
            self.note(build_seconds=step.seconds)
            if step.rc:
                self.stop("build-failed", f"pip install exited {step.rc}"
                          + (f" (over {self.args.build_timeout:g} s)" if step.rc == 124 else "")
                          + ("; no cuBLAS in the toolkit nor in Python's nvidia packages" if kit.cublas == "missing"
                             else ""), log)
                return None
            stamp_file.write_text(json.dumps(stamp))
        self.note(build_reused=reused)
        code = ("import json, llama_cpp; print(json.dumps({'version': llama_cpp.__version__, "
                "'gpu_offload': bool(llama_cpp.llama_supports_gpu_offload())}))")
        check = subprocess.run([self.args.python, "-c", code], capture_output=True, text=True, timeout=120,
                               env=self.env(kit, (target,)))
        try:
            info = json.loads(check.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            with open(log, "a") as out:
                out.write(check.stdout + check.stderr)
            self.stop("import-failed", f"llama_cpp from {target} does not import", log)
            return None
        self.note(llama_cpp=info)
        if not info["gpu_offload"]:
            self.stop("no-offload", f"llama_cpp from {target} has no GPU backend", log)
            return None
        return target

    def models(self, tree: Path) -> list[Path] | None:
        """The random-weight GGUF files of the shapes asked for; None on failure."""
        log, start, vendored = self.out / "llamacpp_models.log", time.monotonic(), tree / "vendor" / "llama.cpp"
        env = self.env(None, (vendored / "gguf-py",))
        paths = []
        for name in self.args.models.split(","):
            path = self.work / "models" / f"{name}.gguf"
            path.parent.mkdir(parents=True, exist_ok=True)
            step = run_step([self.args.python, str(ROOT / "scripts" / "random_gguf.py"), "--vocab",
                             str(vendored / VOCAB), "--out", str(path), name], log, self.args.model_timeout, env)
            if step.rc:
                self.stop("models-failed", f"random_gguf.py {name} exited {step.rc}", log)
                return None
            paths.append(path)
        self.note(models={p.stem: p.stat().st_size for p in paths}, models_seconds=round(time.monotonic() - start, 1))
        return paths

    def profile(self, target: Path, models: list[Path], kit: Toolkit) -> int:
        log, table = self.out / "llamacpp_profile.log", self.out / "llamacpp_cuda_profile.json"
        env = self.env(kit, (target, ROOT), SPECROUTER_CACHE=str(self.work / "cache" / "models"))
        step = run_step([self.args.python, "-c", "from specrouter.cli import main; main()", "profile", "--models",
                         ",".join(map(str, models)), "--gpu-layers", "-1", "--force", "--repeats",
                         str(self.args.repeats), "--json", str(table)], log, self.args.profile_timeout, env)
        self.note(profile_seconds=step.seconds)
        if step.rc:
            return self.stop("profile-failed", f"specrouter profile exited {step.rc}", log)
        self.note(profile=table.name)
        return self.stop("profiled", f"{', '.join(m.stem for m in models)} with every layer on "
                                     f"{self.result['gpu']}: {table}", status=0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("trim", help="the source release without what the build never reads")
    t.add_argument("sdist", type=Path)
    t.add_argument("dest", type=Path)
    r = sub.add_parser("run", help="build, write the models, profile (on the GPU machine)")
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    r.add_argument("--source", type=Path, default=SOURCE, help="what `make gpu-source` made (default .gpu-source)")
    r.add_argument("--work", type=Path, default=WORK, help="build and models (default build/gpu-llamacpp)")
    r.add_argument("--python", default=sys.executable, help="the Python to build for and profile with")
    r.add_argument("--models", default=",".join(MODELS))
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--build-timeout", type=float, default=420)
    r.add_argument("--model-timeout", type=float, default=90, help="seconds per model file")
    r.add_argument("--profile-timeout", type=float, default=150)
    args = ap.parse_args(argv)
    if args.command == "trim":
        print(trim(args.sdist, args.dest))
        return 0
    return Run(args).main()


if __name__ == "__main__":
    sys.exit(main())
