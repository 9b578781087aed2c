"""scripts/gpu_llamacpp.py and scripts/random_gguf.py on the CPU: the GPU check's llama.cpp
step where it stops early (no nvcc, no source), the source release's trimming, the toolkit
probe over fake toolkits, and a random-weight model that llama.cpp loads and profiles."""

import importlib.util
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
RUNNER = SCRIPTS / "gpu_llamacpp.py"


def script(name: str):
    """scripts/<name>.py as a module (registered: its dataclasses look their module up)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return path


def run_check(tmp_path: Path, bin_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": str(bin_dir), "CUDA_HOME": str(tmp_path / "cuda"), "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, str(RUNNER), "run", "--out", str(tmp_path / "out"), "--work",
                           str(tmp_path / "work"), *args], env=env, capture_output=True, text=True, timeout=60)


def test_without_nvcc_the_check_says_so_and_exits_0(tmp_path):
    (tmp_path / "bin").mkdir()
    done = run_check(tmp_path, tmp_path / "bin", "--source", str(tmp_path / "none"))
    reason = f"no nvcc on PATH or in {tmp_path}/cuda/bin: llama.cpp's CUDA backend cannot be built here"
    assert (done.returncode, done.stdout, done.stderr) == (0, f"gpu_llamacpp: no-nvcc: {reason}\n", "")
    assert json.loads((tmp_path / "out" / "gpu_llamacpp.json").read_text()) == {"result": "no-nvcc", "reason": reason}
    assert not (tmp_path / "work").exists()


def test_with_nvcc_and_a_gpu_but_no_source_it_says_how_to_bring_it(tmp_path):
    bin_dir = tmp_path / "bin"
    executable(bin_dir / "nvcc", 'echo "Cuda compilation tools, release 12.8, V12.8.93"\n')
    executable(bin_dir / "nvidia-smi", 'echo "NVIDIA H100 80GB HBM3, 9.0"\n')
    (tmp_path / "empty").mkdir()
    done = run_check(tmp_path, bin_dir, "--source", str(tmp_path / "empty"))
    reason = (f"no llama_cpp_python-*.tar.gz in {tmp_path}/empty: run `make gpu-source` where there is network "
              "and bring that folder along")
    assert (done.returncode, done.stdout) == (1, f"gpu_llamacpp: no-source: {reason}\n")
    assert json.loads((tmp_path / "out" / "gpu_llamacpp.json").read_text()) == {
        "result": "no-source", "reason": reason, "nvcc": str(bin_dir / "nvcc"), "cuda": "12.8, V12.8.93",
        "gpu": "NVIDIA H100 80GB HBM3", "arch": "90"}


def test_trimming_keeps_what_the_build_reads_and_the_qwen2_vocabulary(tmp_path):
    names = ["p-1/PKG-INFO", "p-1/.git/HEAD", "p-1/CMakeLists.txt", "p-1/llama_cpp/llama.py",
             "p-1/vendor/llama.cpp/.git", "p-1/vendor/llama.cpp/CMakeLists.txt", "p-1/vendor/llama.cpp/docs/a.md",
             "p-1/vendor/llama.cpp/benches/b.json", "p-1/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf",
             "p-1/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf", "p-1/vendor/llama.cpp/models/templates/t.jinja",
             "p-1/vendor/llama.cpp/tools/ui/index.html", "p-1/vendor/llama.cpp/tools/mtmd/mtmd.cpp",
             "p-1/vendor/llama.cpp/src/models/qwen2.cpp", "p-1/vendor/llama.cpp/gguf-py/gguf/__init__.py"]
    for name in names:
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_text(name)
    with tarfile.open(tmp_path / "p-1.tar.gz", "w:gz") as tar:
        for name in names:
            tar.add(tmp_path / "src" / name, name)
    (tmp_path / "dest").mkdir()
    out = script("gpu_llamacpp").trim(tmp_path / "p-1.tar.gz", tmp_path / "dest")
    with tarfile.open(out) as tar:
        kept = {m.name: tar.extractfile(m).read().decode() for m in tar if m.isfile()}
    assert kept == {n: n for n in ["p-1/PKG-INFO", "p-1/CMakeLists.txt", "p-1/llama_cpp/llama.py",
                                   "p-1/vendor/llama.cpp/CMakeLists.txt",
                                   "p-1/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf",
                                   "p-1/vendor/llama.cpp/tools/mtmd/mtmd.cpp",
                                   "p-1/vendor/llama.cpp/src/models/qwen2.cpp",
                                   "p-1/vendor/llama.cpp/gguf-py/gguf/__init__.py"]}
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == ["p-1.tar.gz"]


def fake_toolkit(root: Path, files: list[str]) -> Path:
    """A toolkit folder holding `files`, with an nvcc that names it as nvcc --dryrun does."""
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    return executable(root / "bin" / "nvcc", f'echo "#$ TOP={root}/bin/.."\n')


def test_a_toolkit_with_cublas_and_the_driver_stub_needs_no_hints(tmp_path):
    gpu = script("gpu_llamacpp")
    nvcc = fake_toolkit(tmp_path / "cuda", ["include/cublas_v2.h", "lib64/libcublas.so.12",
                                            "lib64/stubs/libcuda.so"])
    kit = gpu.probe_toolkit(nvcc, "/bin/true", system_includes=(), system_libs=())
    assert kit == gpu.Toolkit(top=str(tmp_path / "cuda"), cublas="toolkit", driver="found")


def test_cublas_of_pythons_nvidia_packages_and_the_drivers_library_are_named_to_cmake(tmp_path, monkeypatch):
    gpu = script("gpu_llamacpp")
    nvcc = fake_toolkit(tmp_path / "cuda", ["include/cuda_runtime.h", "lib64/libcudart.so"])
    site = tmp_path / "site" / "nvidia" / "cu13"
    for name in ["include/cublas_v2.h", "lib/libcublas.so.13", "lib/libcublasLt.so.13"]:
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text("")
    (tmp_path / "syslib").mkdir()
    (tmp_path / "syslib" / "libcuda.so.1").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    kit = gpu.probe_toolkit(nvcc, sys.executable, system_includes=(), system_libs=(str(tmp_path / "syslib"),))
    assert kit == gpu.Toolkit(
        top=str(tmp_path / "cuda"), cublas="python", driver=str(tmp_path / "syslib" / "libcuda.so.1"),
        cmake=[f"-DCUDA_cublas_LIBRARY={site}/lib/libcublas.so.13",
               f"-DCUDA_cublasLt_LIBRARY={site}/lib/libcublasLt.so.13",
               f"-DCUDA_cuda_driver_LIBRARY={tmp_path}/syslib/libcuda.so.1"],
        includes=[f"{site}/include"], libraries=[f"{site}/lib"])


def test_without_cublas_or_a_driver_library_the_build_goes_without_vmm_and_fails_saying_why(tmp_path):
    gpu = script("gpu_llamacpp")
    nvcc = fake_toolkit(tmp_path / "cuda", ["include/cuda_runtime.h"])
    kit = gpu.probe_toolkit(nvcc, "/bin/true", system_includes=(), system_libs=())
    assert kit == gpu.Toolkit(top=str(tmp_path / "cuda"), cmake=["-DGGML_CUDA_NO_VMM=ON"])


def byte_vocabulary(path: Path) -> None:
    """A GGUF holding only a byte-level BPE tokenizer (GPT-2's byte alphabet) and an end token."""
    import gguf

    visible = [*range(33, 127), *range(161, 173), *range(174, 256)]
    hidden = sorted(set(range(256)) - set(visible))
    alphabet = {b: chr(b) for b in visible} | {b: chr(256 + i) for i, b in enumerate(hidden)}
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([alphabet[b] for b in range(256)] + ["<|endoftext|>"])
    writer.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL])
    writer.add_token_merges(["Ġ Ġ"])
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(256)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_random_tiny_model_has_the_q4_k_m_layout_and_llama_cpp_profiles_it(tmp_path):
    pytest.importorskip("llama_cpp")
    gguf = pytest.importorskip("gguf")
    from click.testing import CliRunner

    from specrouter.cli import main
    from specrouter.router.estimates.profiler import PROFILE_BATCH_NS, PROFILE_BATCHES, PROFILE_NS

    byte_vocabulary(tmp_path / "vocab.gguf")
    model = tmp_path / "tiny.gguf"
    random_gguf = script("random_gguf")
    assert random_gguf.main(["--vocab", str(tmp_path / "vocab.gguf"), "--out", str(model), "--tiny",
                             "qwen2.5-coder-0.5b"]) == 0
    reader = gguf.GGUFReader(model)
    written = {t.name: (t.tensor_type.name, tuple(int(d) for d in t.shape)) for t in reader.tensors}
    # Rows of 128 (under a K-quant block: Q4_K falls back to Q5_0, Q6_K to Q8_0), of 256 in
    # ffn_down; of 2 layers llama.cpp's rule gives the second more bits.
    heavy = {0: ("Q5_0", "Q4_K"), 1: ("Q8_0", "Q6_K")}
    assert written == {"token_embd.weight": ("Q5_0", (128, 257)), "output_norm.weight": ("F32", (128,)),
                       "output.weight": ("Q8_0", (128, 257)),
                       **{f"blk.{i}.{name}": value for i in range(2) for name, value in {
                           "attn_norm.weight": ("F32", (128,)), "attn_q.weight": ("Q5_0", (128, 128)),
                           "attn_q.bias": ("F32", (128,)), "attn_k.weight": ("Q5_0", (128, 64)),
                           "attn_k.bias": ("F32", (64,)), "attn_v.weight": (heavy[i][0], (128, 64)),
                           "attn_v.bias": ("F32", (64,)), "attn_output.weight": ("Q5_0", (128, 128)),
                           "ffn_norm.weight": ("F32", (128,)), "ffn_gate.weight": ("Q5_0", (128, 256)),
                           "ffn_up.weight": ("Q5_0", (128, 256)), "ffn_down.weight": (heavy[i][1], (256, 128))
                       }.items()}}
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert np.all(np.asarray(embedding.data).reshape(-1, 22)[:, :2].view(np.float16) == np.float16(2**-8))
    assert not list(tmp_path.glob("*.part"))

    result = CliRunner().invoke(main, ["profile", "--models", str(model), "--repeats", "1", "--threads", "1",
                                       "--force", "--json", str(tmp_path / "profile.json")])
    assert result.exit_code == 0, result.output
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert list(profile["models"]) == ["tiny"] and list(profile["models"]["tiny"]) == [str(n) for n in PROFILE_NS]
    assert {b: list(t) for b, t in profile["batched"]["tiny"].items()} == \
        {str(b): [str(n) for n in PROFILE_BATCH_NS] for b in PROFILE_BATCHES}


def test_more_bits_go_to_the_layers_llama_cpp_met_in_name_order():
    random_gguf = script("random_gguf")
    assert sorted(random_gguf.more_bits_layers(24)) == [0, 1, 3, 6, 7, 8, 9, 10, 13, 16, 19, 21]
    assert sorted(random_gguf.more_bits_layers(28)) == [0, 1, 5, 6, 7, 8, 9, 10, 13, 16, 19, 21, 24, 27]
    assert sorted(random_gguf.more_bits_layers(2)) == [1]


def test_the_check_runs_without_the_projects_packages():
    """gpu_llamacpp.py imports only the standard library: it runs before anything is installed."""
    done = subprocess.run([sys.executable, "-S", "-E", str(RUNNER), "--help"], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout.split("\n")[0]) == (0, "usage: gpu_llamacpp.py [-h] {trim,run} ...")
