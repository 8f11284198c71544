"""FSDP2 on two CPU processes (gloo) trains the ACoT tiny recipe to the losses of one process, and the
accelerate configs for FSDP2 and DeepSpeed ZeRO-2/3 parse.

Why it is launched this way. accelerate 1.15 has no FSDP on CPU: `AcceleratorState` switches to FSDP
only for accelerator device types (MULTI_GPU, MULTI_XPU, ...); on CPU it stays MULTI_CPU, drops the
FSDP plugin and wraps the model in DDP, without a word (checked: `Accelerator(cpu=True,
fsdp_plugin=FSDP2)` under torchrun gives MULTI_CPU and a DistributedDataParallel). torch's FSDP2
(`torch.distributed.fsdp.fully_shard`) does run on CPU with gloo. So AnchoredSFTTrainer, when a CPU
process group asks for FSDP (an `accelerate launch` FSDP config, or `training.fsdp` under torchrun),
puts the FSDP2 state back, and accelerate's own FSDP2 preparation then shards the model with
`fully_shard` as it does on GPUs. The test launches through `accelerate launch` with
train/accelerate/fsdp2_cpu.yaml (the FSDP launcher is the MULTI_GPU one: two real workers) and asserts
what the workers saw: world size 2, accelerate's distributed type FSDP, every parameter a DTensor,
the blocks FSDP modules, and each process holding about half the parameters. A launch that silently
fell back to DDP, or to one process, fails.
"""
from __future__ import annotations

import pytest
from test_ddp import assert_same_training, needs_accelerate, one_process, two_processes

from anchored_reasoning.resources import builtin_dir

ACCELERATE_DIR = builtin_dir("train") / "accelerate"


@pytest.mark.slow
@needs_accelerate
def test_two_process_fsdp2_matches_one_process(tmp_path):
    from transformers import AutoModelForCausalLM

    single = one_process(tmp_path / "one", 8)
    fsdp = two_processes("fsdp2_cpu.yaml", tmp_path / "two", 4)
    assert fsdp["world_size"] == 2, "the launch did not form a 2-process group"
    dist = fsdp["distributed"]
    assert dist["type"] == "FSDP" and dist["fsdp_version"] == 2, dist  # not DDP (MULTI_CPU)
    assert dist["parameter_types"] == ["DTensor"], dist
    assert {"FSDPGPT2Block", "FSDPGPT2LMHeadModel"} <= set(dist["fsdp_modules"]), dist
    assert 0.45 <= dist["local_parameter_share"] <= 0.6, dist  # each process holds about half
    # same global batch (2 x 4 = 8); FSDP's gradient reduce-scatter averages as DDP does
    assert_same_training(single, fsdp, rel=1e-4)
    # the sharded model was gathered into whole save_pretrained weights, equal to the 1-process ones
    ref = AutoModelForCausalLM.from_pretrained(tmp_path / "one").state_dict()
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "two").state_dict()
    assert ref.keys() == got.keys()
    for name, tensor in ref.items():
        assert got[name].shape == tensor.shape, name
        assert (got[name] - tensor).abs().max().item() < 1e-4, name


def _launch_line(path) -> str:
    return f"accelerate launch --config_file train/accelerate/{path.name} -m anchored_reasoning.cli train"


@pytest.mark.parametrize("name", sorted(p.name for p in ACCELERATE_DIR.glob("*.yaml")))
def test_accelerate_config_parses_and_says_how_to_launch(name):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    path = ACCELERATE_DIR / name
    config = load_config_from_file(str(path))  # unknown keys raise here
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert any(_launch_line(path) in line for line in header), f"{name}: no launch line in the comment header"
    if name.startswith("deepspeed_"):
        assert config.distributed_type == DistributedType.DEEPSPEED
        stage = int(name.split("zero")[1][0])
        assert config.deepspeed_config["zero_stage"] == stage
        if stage == 3:  # without it Trainer.save_model cannot write whole weights
            assert config.deepspeed_config["zero3_save_16bit_model"] is True
    elif name.startswith("fsdp"):
        assert config.distributed_type == DistributedType.FSDP
        assert config.fsdp_config["fsdp_version"] == 2
        assert config.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"  # the trainer refuses others
    if name.endswith("_cpu.yaml"):
        assert config.mixed_precision == "no" and config.num_processes == 2


def test_each_kind_of_config_is_shipped():
    names = {p.name for p in ACCELERATE_DIR.glob("*.yaml")}
    assert {"ddp_cpu.yaml", "ddp_gpu.yaml", "fsdp2_cpu.yaml", "fsdp2_gpu.yaml",
            "deepspeed_zero2_gpu.yaml", "deepspeed_zero3_gpu.yaml"} <= names


class _Fake:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _trainer(distributed_type, fsdp_plugin_args=None):
    return _Fake(accelerator=_Fake(distributed_type=distributed_type), args=_Fake(fsdp_plugin_args=fsdp_plugin_args))


def test_fsdp_plugin_comes_back_only_for_a_cpu_group_that_asked(monkeypatch):
    from accelerate.utils import DistributedType

    from anchored_reasoning.errors import ConfigError
    from anchored_reasoning.train.trainers.acot_trainer import _fsdp_plugin_for_cpu

    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    args = {"fsdp_version": 2, "state_dict_type": "FULL_STATE_DICT"}
    assert _fsdp_plugin_for_cpu(_trainer(DistributedType.MULTI_CPU)) is None  # plain DDP stays DDP
    assert _fsdp_plugin_for_cpu(_trainer(DistributedType.NO, args)) is None  # one process
    assert _fsdp_plugin_for_cpu(_trainer(DistributedType.FSDP, args)) is None  # GPUs: accelerate did it
    plugin = _fsdp_plugin_for_cpu(_trainer(DistributedType.MULTI_CPU, args))  # training.fsdp=true
    assert plugin.fsdp_version == 2 and "FULL_STATE_DICT" in str(plugin.state_dict_type)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` with an FSDP config sets
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert _fsdp_plugin_for_cpu(_trainer(DistributedType.MULTI_CPU)).fsdp_version == 2
    with pytest.raises(ConfigError, match="fsdp_version 1"):
        _fsdp_plugin_for_cpu(_trainer(DistributedType.MULTI_CPU, {**args, "fsdp_version": 1}))
