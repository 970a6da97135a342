"""Tiny Zebra models with every tensor random (norms included), so a swapped or mis-split tensor changes logits."""

from __future__ import annotations

import warnings

warnings.filterwarnings("ignore", message=".*CPU.*")  # FLA warns that its kernels need a GPU

SHAPES = {  # name -> recipe overrides on top of `tiny` (hidden 64, byte vocab 272)
    "gdn": ["model.pattern=null", "model.num_layers=4", "model.recurrent_type=gdn"],
    "kda": ["model.pattern=null", "model.num_layers=4", "model.recurrent_type=kda"],
    "gla": [
        "model.pattern=null",
        "model.num_layers=4",
        "model.recurrent_type=gla",
        "model.gla.num_heads=2",
        "model.gla.head_dim=16",
        "model.gla.head_v_dim=32",
    ],
    "mamba-mla": [
        "model.pattern=null",
        "model.num_layers=8",
        "model.recurrent_type=mamba2",
        "model.hybrid_attention_ratio=0.25",
    ],
    "hybrid": [],  # *-M-G-K-: every kind at once
}


def build_model(kind: str, *, seed: int = 0, tie: bool = True, extra: tuple[str, ...] = ()):
    """(recipe, ZebraForCausalLM) with all parameters drawn at random, float32, torch kernels."""
    import torch

    from zebra.models import ZebraForCausalLM
    from zebra.recipes import load_recipe

    recipe = load_recipe(
        "tiny", overrides=[*SHAPES[kind], f"model.tie_embeddings={str(tie).lower()}", *extra]
    )
    config = recipe.model.to_config(kernel_backend="torch")
    torch.manual_seed(seed)
    model = ZebraForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.05
            if name.endswith(("norm.weight", "q_norm.weight", "kv_norm.weight", "o_norm.weight")):
                p.copy_(1.0 + noise)  # norms near one, but each different
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, generator=gen) * 4 + 1))
            elif name.endswith("dt_bias"):
                p.copy_(noise - 2.0)
            else:
                p.copy_(noise * 2)
    return recipe, model


def tokens(vocab: int = 259, batch: int = 2, length: int = 12, seed: int = 7):
    import torch

    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model, ids):
    import torch

    with torch.no_grad():
        return model(input_ids=ids).logits


def load_zebra(directory):
    """A converted Zebra export loaded with the library's class (torch kernels)."""
    from zebra.models import ZebraForCausalLM

    return ZebraForCausalLM.from_pretrained(directory, kernel_backend="torch").eval()


def write_run(run_dir, recipe, model, step=20):
    """A training run as the trainer leaves it: config.yaml, checkpoints/step_XXXXXXX (DCP) and `latest`."""
    import torch

    from zebra.recipes.loader import dump_recipe
    from zebra.train.checkpoint import Checkpointer
    from zebra.train.dist import DistEnv

    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_recipe(recipe))
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    state = {
        "model": model.state_dict(),
        "optimizer": {"state": {"exp_avg": torch.zeros(4)}},
        "progress": {"step": torch.tensor(step)},
    }
    return Checkpointer(run_dir, keep_last=2, env=env).save(step, state, {"consumed_samples": 64})


# `zebra train` arguments: a few optimizer steps on the bundled corpus, small batches: trained weights (not the
# init) in seconds
TRAIN = ["--data", "@sample", "--max-steps", "4"] + [
    arg
    for o in (
        "data.seq_len=32",
        "train.global_batch_size=4",
        "train.micro_batch_size=4",
        "train.warmup_steps=1",
        "train.eval_interval=0",
        "train.save_interval=0",
        "train.export=false",
        "train.lr=5e-3",
    )
    for arg in ("--set", o)
]
