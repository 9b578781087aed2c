"""--gpu-layers: parsing (every model, one model, all layers), bad values as clear errors,
and offload refused by a CPU-only llama.cpp build before any file is read (CI's build)."""

import pytest
from click.testing import CliRunner

from specrouter.cli import main
from specrouter.errors import BackendError, InvalidParameterError
from specrouter.offload import ALL_LAYERS, GpuLayers
from specrouter.server.config import load_config

llama_cpp = pytest.importorskip("llama_cpp")
CPU_BUILD = not llama_cpp.llama_supports_gpu_offload()


def test_every_model_one_model_and_all_layers():
    assert GpuLayers.parse([]) == GpuLayers() and not GpuLayers().any
    layers = GpuLayers.parse(["qwen2.5-coder-0.5b=-1", "12", "/models/big.gguf=40"])
    assert layers.of("qwen2.5-coder-0.5b") == ALL_LAYERS and layers.of("/models/big.gguf") == 40
    assert layers.of("qwen2.5-coder-1.5b") == 12 and layers.any
    assert GpuLayers.parse(["a=0"]).of("a") == 0 and not GpuLayers.parse(["a=0"]).any


@pytest.mark.parametrize(("values", "message"), [
    (["x"], "--gpu-layers takes N or MODEL=N with N an integer >= -1 (-1: every layer), got 'x'"),
    (["-2"], "got '-2'"),
    (["m=two"], "got 'm=two'"),
    (["=3"], "got '=3'"),
    (["3", "4"], "--gpu-layers gives the layers of every model twice"),
    (["m=3", "m=4"], "--gpu-layers gives m twice"),
])
def test_bad_values_are_clear_errors(values, message):
    with pytest.raises(InvalidParameterError) as info:
        GpuLayers.parse(values)
    assert message in str(info.value)


def test_the_server_config_checks_them_by_name():
    assert load_config(gpu_layers=["8"]).offload == GpuLayers(8)
    with pytest.raises(InvalidParameterError, match="gpu_layers: .*got 'all'"):
        load_config(gpu_layers=["all"])


@pytest.mark.skipif(not CPU_BUILD, reason="this llama-cpp-python build has a GPU backend")
def test_a_cpu_only_build_refuses_offload_before_reading_the_file(tmp_path):
    from specrouter.backends.llamacpp import LlamaCppBackend

    with pytest.raises(BackendError, match="m: --gpu-layers asks llama.cpp to offload every layer to a GPU, but "
                                           r"this build of llama-cpp-python has no GPU backend \(build it with "
                                           "`make setup GPU=cuda`"):
        LlamaCppBackend(tmp_path / "m.gguf", n_gpu_layers=-1)
    with pytest.raises(InvalidParameterError, match="exact mode runs llama.cpp's CPU kernels"):
        LlamaCppBackend(tmp_path / "m.gguf", n_gpu_layers=4, exact=True)
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"GGUF")
    result = CliRunner().invoke(main, ["generate", "--prompt", "x", "--chain", str(bogus), "--gpu-layers", "8"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "error: model: --gpu-layers asks llama.cpp to offload 8 layers to a GPU" in result.output
