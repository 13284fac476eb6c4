"""Heads loading and saving in every format, strict checks with one-line errors, base-model loading."""
import re
import warnings

import pytest
import torch
import transformers
from helpers import TESTED_TRANSFORMERS

from workbench import REPO_ROOT, WorkbenchError
from workbench.runtime.heads import MedusaHeads, check_heads_fit, load_heads, save_heads
from workbench.runtime.models import load_base, load_model_and_heads, pick_device, pick_dtype
from support.tiny import random_heads


def _same(a: MedusaHeads, b: MedusaHeads) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k].float().cpu(), sb[k].float().cpu()), k


def _one_line_error(fn, *match):
    with pytest.raises(WorkbenchError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg
    for m in match:
        assert m in msg, msg
    return msg


@pytest.mark.parametrize("fmt,tied", [("1", False), ("2", True)])
def test_saved_heads_reload_identically(tiny_llama, fmt, tied):
    heads, cfg = load_heads(tiny_llama.heads_dirs[fmt])
    assert heads.tied is tied and heads.num_heads == 5 and heads.num_layers == 1
    assert cfg["medusa_num_heads"] == 5 and cfg["medusa_format"] == int(fmt)
    _same(heads, tiny_llama.heads[fmt])
    assert all(p.abs().sum() > 0 for p in heads.parameters())  # nothing zero-filled or dropped


def test_released_config_quirk_trusts_the_weights_and_warns(tiny_llama):
    with pytest.warns(UserWarning, match="config says 2 heads but the weights hold 5"):
        heads, _ = load_heads(tiny_llama.heads_dirs["1pt"])
    assert heads.num_heads == 5
    _same(heads, tiny_llama.heads["1"])


def test_medusa2_checkpoint_heads_come_from_the_model_weights(tiny_llama):
    heads, cfg = load_heads(tiny_llama.heads_dirs["3"])
    assert not heads.tied and cfg["medusa_num_heads"] == 5
    _same(heads, tiny_llama.heads["1"])


@pytest.mark.parametrize("fmt", ["1", "1pt", "2", "3"])
def test_load_model_and_heads_every_format(tiny, fmt):
    model_dir = tiny.heads_dirs["3"] if fmt == "3" else tiny.model_dir
    heads_arg = None if fmt == "3" else str(tiny.heads_dirs[fmt])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base, tok, heads = load_model_and_heads(str(model_dir), heads_arg, device="cpu")
    assert base.dtype == torch.float32 and base.device.type == "cpu" and tok.eos_token_id == 2
    _same(heads, tiny.heads["2" if fmt == "2" else "1"])
    assert heads.vocab_size == 128
    for a, b in zip(base.state_dict().values(), tiny.model.state_dict().values()):
        assert torch.equal(a, b)
    # heads produce [K, ..., V] logits on the base's lm_head
    out = heads(torch.randn(3, 64), base.get_output_embeddings())
    assert out.shape == (5, 3, 128)
    assert heads(torch.randn(64), base.get_output_embeddings(), n=2).shape == (2, 128)


def test_dtype_override_applies_to_base_and_heads(tiny_llama):
    base, _, heads = load_model_and_heads(str(tiny_llama.model_dir), str(tiny_llama.heads_dirs["2"]), "cpu", "bfloat16")
    assert base.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in heads.parameters())


@pytest.mark.unit
def test_save_heads_format_must_match_the_heads(tmp_path):
    untied = random_heads(16, 32, 2, tied=False)
    tied = random_heads(16, 32, 2, tied=True)
    _one_line_error(lambda: save_heads(tied, tmp_path / "a", "m", fmt=1), "format 1")
    _one_line_error(lambda: save_heads(untied, tmp_path / "b", "m", fmt=2), "format 2")


# ----------------------------------------------------------------------------------------------- broken checkpoints

def _sd(tiny, fmt="1"):
    return {k: v.clone() for k, v in tiny.heads[fmt].state_dict().items()}


def test_missing_tensor(tiny_llama, make_heads_dir):
    sd = _sd(tiny_llama)
    del sd["3.0.linear.bias"]
    _one_line_error(lambda: load_heads(make_heads_dir(sd)), "missing tensor '3.0.linear.bias'")


def test_missing_lm_head_of_one_head(tiny_llama, make_heads_dir):
    sd = _sd(tiny_llama)
    del sd["2.1.weight"]
    _one_line_error(lambda: load_heads(make_heads_dir(sd)), "missing tensor '2.1.weight'")


@pytest.mark.parametrize("key", ["0.0.linear.extra", "1.1.bias", "medusa_head.0.0.linear.weight"])
def test_unexpected_tensor(tiny_llama, make_heads_dir, key):
    sd = _sd(tiny_llama)
    sd[key] = torch.ones(128)
    _one_line_error(lambda: load_heads(make_heads_dir(sd)), f"unexpected tensor '{key}'")


def test_wrong_shape(tiny_llama, make_heads_dir):
    sd = _sd(tiny_llama)
    sd["4.0.linear.weight"] = torch.ones(64, 63)
    _one_line_error(lambda: load_heads(make_heads_dir(sd)), "'4.0.linear.weight'", "[64, 63]", "[64, 64]")


def test_nan_weights(tiny_llama, make_heads_dir):
    sd = _sd(tiny_llama, "2")
    sd["1.0.linear.weight"][0, 0] = float("nan")
    _one_line_error(lambda: load_heads(make_heads_dir(sd)), "'1.0.linear.weight'", "NaN")


def test_config_layer_count_must_match(tiny_llama, make_heads_dir):
    folder = make_heads_dir(_sd(tiny_llama), {"medusa_num_heads": 5, "medusa_num_layers": 2})
    _one_line_error(lambda: load_heads(folder), "medusa_num_layers=2", "1 ResBlock")


@pytest.mark.unit
@pytest.mark.parametrize("name", ["medusa_lm_head.safetensors", "medusa_lm_head.pt"])
def test_corrupt_file(tmp_path, name):
    (tmp_path / name).write_bytes(b"\x00garbage, not a weights file" * 10)
    _one_line_error(lambda: load_heads(tmp_path), "cannot read the weights")


def test_pt_is_loaded_with_weights_only(tmp_path, tiny_llama):
    obj = _sd(tiny_llama)
    obj["payload"] = {"not": "a tensor", "fn": print}  # a pickle that full unpickling would accept
    torch.save(obj, tmp_path / "medusa_lm_head.pt")
    _one_line_error(lambda: load_heads(tmp_path), "cannot read the weights")


@pytest.mark.unit
def test_empty_folder_and_missing_path(tmp_path):
    _one_line_error(lambda: load_heads(tmp_path), "no medusa_lm_head")
    _one_line_error(lambda: load_heads(tmp_path / "nope"), "no such file")


def test_heads_for_another_hidden_size(tiny_llama, tmp_path):
    folder = save_heads(random_heads(32, 128, 3, tied=True), tmp_path / "h", "other")
    _one_line_error(lambda: load_model_and_heads(str(tiny_llama.model_dir), str(folder), "cpu"),
                    "hidden size 32", "64")


def test_heads_for_another_vocabulary(tiny_llama, tmp_path):
    folder = save_heads(random_heads(64, 100, 3, tied=False), tmp_path / "h", "other")
    _one_line_error(lambda: load_model_and_heads(str(tiny_llama.model_dir), str(folder), "cpu"),
                    "vocabulary 100", "128")
    _one_line_error(lambda: check_heads_fit(random_heads(64, 100, 1, tied=False), tiny_llama.model), "vocabulary 100")


def test_model_without_heads_is_an_error(tiny_llama):
    _one_line_error(lambda: load_model_and_heads(str(tiny_llama.model_dir), None, "cpu"), "without --heads")


@pytest.mark.unit
def test_demo_heads_missing_is_a_one_line_error(monkeypatch, tmp_path):
    import workbench.runtime.models as models

    monkeypatch.setattr(models, "DEMO_HEADS", tmp_path / "absent")
    _one_line_error(lambda: load_model_and_heads(None, None), "demo heads")


@pytest.mark.unit
def test_bad_base_model_paths(tmp_path):
    _one_line_error(lambda: load_base(str(tmp_path), "cpu"), "cannot load it")
    _one_line_error(lambda: load_base(str(tmp_path / "x.gguf"), "cpu"), "GGUF file not found")


@pytest.mark.unit
def test_device_and_dtype_choices():
    assert pick_device("cpu").type == "cpu"
    assert pick_dtype(None, torch.device("cpu")) == torch.float32
    assert pick_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    _one_line_error(lambda: pick_device("tpu-9"), "unknown device")
    _one_line_error(lambda: pick_dtype("int3", torch.device("cpu")), "unknown dtype")
    if not torch.cuda.is_available():
        _one_line_error(lambda: pick_device("cuda"), "CUDA is not available")


@pytest.mark.slow
def test_gguf_file_loads_through_transformers():
    from workbench.runtime.models import demo_gguf_path

    gguf = demo_gguf_path()  # the demo model is installed with the package: a missing file fails
    model, tok = load_base(str(gguf), "cpu")
    assert model.dtype == torch.float32 and model.config.model_type == "llama"
    assert tok.decode(tok("Hello").input_ids, skip_special_tokens=True) == "Hello"


def test_heads_saved_in_fp16_load_back_as_float(tiny_llama, tmp_path):
    from safetensors.torch import load_file

    from workbench.runtime.heads import load_heads, save_heads

    heads = tiny_llama.heads["2"]
    folder = save_heads(heads, tmp_path / "h16", "tiny", dtype=torch.float16)
    assert {t.dtype for t in load_file(str(folder / "medusa_lm_head.safetensors")).values()} == {torch.float16}
    back, _ = load_heads(folder)
    for (k, a), (_, b) in zip(heads.state_dict().items(), back.state_dict().items()):
        assert b.dtype == torch.float32 and torch.allclose(a, b, rtol=1e-3, atol=1e-3), k


@pytest.mark.unit
def test_transformers_is_a_version_the_suite_passed_with():
    """The README names the versions the suite passed with, and pyproject's range allows exactly those minor
    versions (a range with an untested end promises what nobody checked: 4.57 lacks the StaticLayer write pointer
    engine.py moves; a later minor may drop an API). Another installed version (pip told to ignore the range) is a
    warning, not a failure: the suite may pass, but a failure there is to be compared with a tested version first."""
    line = re.search(r"tested with transformers ([\d.]+(?:(?:, | and )[\d.]+)*)", (REPO_ROOT / "README.md").read_text())
    assert line and re.split(r", | and ", line.group(1)) == list(TESTED_TRANSFORMERS)
    low, high = re.search(r'"transformers>=([\d.]+),<([\d.]+)"', (REPO_ROOT / "pyproject.toml").read_text()).groups()
    major, lo, hi = int(low.split(".")[0]), int(low.split(".")[1]), int(high.split(".")[1])
    assert high.split(".")[0] == str(major), "the range stays within one major version"
    assert [f"{major}.{m}" for m in range(lo, hi)] == list(TESTED_TRANSFORMERS)  # every allowed minor was tested
    installed = ".".join(transformers.__version__.split(".")[:2])
    if installed not in TESTED_TRANSFORMERS:
        warnings.warn(f"transformers {transformers.__version__} is not among the versions this suite passed with "
                      f"({', '.join(TESTED_TRANSFORMERS)}): compare a failure with one of those first")
