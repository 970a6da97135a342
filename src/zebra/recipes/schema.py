"""The recipe schema: typed sections with documented, range-checked fields.

A recipe YAML has these top-level keys: `name`, `description`, `extends`, and the sections `model`, `data`,
`train`, `distill`, `launch`. Every field below is one key; its metadata gives the allowed range or choices. The loader
(`zebra.recipes.loader`) turns a merged YAML mapping into these objects and reports any problem as
`file: key.path: problem (expected ...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass, make_dataclass
from typing import Any

from zebra.data.paths import DataPath
from zebra.mixers import MIXERS, MLA, MixerSpec, recurrent_names
from zebra.mixers.spec import HEAD_DIM, HEADS, POSITIONS
from zebra.spec.arch import KERNEL_BACKENDS, MODEL_DEFAULTS

# Upper bounds of the counts and sizes a recipe takes: far above any real model or run, low enough that a typo
# (an extra zero or ten) is refused when the recipe loads (`recipes show`, `train --dry-run`) instead of a
# training that allocates terabytes or loops for hours building its data index (the mixers' own sizes:
# `zebra.mixers.spec`).
WIDTH = 1 << 18  # model width
LAYERS = 4096  # sublayers
VOCAB = 1 << 24
STEPS = 1_000_000_000
BATCH = 1 << 24  # sequences in a batch
MAX_SEQUENCES = (
    1 << 31
)  # sequences in a run (max_steps x global_batch_size): megatron's sample index is int32


def spec(
    default: Any = None,
    *,
    doc: str,
    min: float | None = None,
    max: float | None = None,
    choices: tuple | Callable[[], tuple] | None = None,
    factory: Any = None,
) -> Any:
    """A schema field: default, one-line doc, and an optional numeric range or set of choices (a tuple, or a
    function returning one when the choices can grow at run time, e.g. the registered mixers)."""
    meta = {"doc": doc, "min": min, "max": max, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def field_choices(meta: Mapping[str, Any]) -> tuple | None:
    """The allowed values of a field from its metadata, or None when any value of its type goes."""
    choices = meta.get("choices")
    return choices() if callable(choices) else choices


def mixer_section(mixer: MixerSpec) -> type:
    """The recipe section `model.<section>` of a mixer, made from its `fields` (names, defaults, docs, ranges:
    declared once, in the mixer's module)."""
    return make_dataclass(
        f"{mixer.label}Spec",
        [(f.name, type(f.default), spec(f.default, doc=f.doc, min=f.min, max=f.max)) for f in mixer.fields],
        kw_only=True,
    )


MLASpec = mixer_section(MLA)  # Multi-Latent Attention (DeepSeek-V2 style, as in Zebra-Llama)


# The one map between the recipe's and the model config's names: recipe path (`model.<path>`) -> ZebraConfig key,
# where they differ. Every other field of `model` is its ZebraConfig key, and a mixer section's field is its
# spec's `config_key` (`<config_prefix>_<field>`, or the field's own `key`: MLA's `num_heads` is
# `num_attention_heads`, its YaRN pair entries of `rope_scaling`); `flat` and `overrides_from_config` both read
# `config_paths`.
CONFIG_KEYS = {
    "num_layers": "num_hidden_layers",
    "pattern": "layer_pattern",
    "norm_eps": "rms_norm_eps",
    "tie_embeddings": "tie_word_embeddings",
    "init_std": "initializer_range",
}


def _default(path: str) -> Any:
    """The default of a model-wide recipe field: `zebra.spec.arch.MODEL_DEFAULTS` of its ZebraConfig key."""
    return MODEL_DEFAULTS[CONFIG_KEYS.get(path, path)]


@dataclass(kw_only=True)
class TeacherSpec:
    """The Llama model the hybrid is distilled from: only used to report the KV-cache fraction."""

    name: str = spec("", doc="teacher model name (for display)")
    num_layers: int = spec(16, doc="teacher transformer layers", min=1, max=LAYERS)
    num_kv_heads: int = spec(8, doc="teacher key/value heads", min=1, max=HEADS)
    head_dim: int = spec(64, doc="teacher head dim", min=1, max=HEAD_DIM)


@dataclass(kw_only=True)
class _ModelFields:
    """The model section's own fields; `ModelSpec` adds one section per mixer with fields (`mixer_section`)."""

    vocab_size: int = spec(
        _default("vocab_size"), doc="vocabulary size (must cover the tokenizer)", min=2, max=VOCAB
    )
    hidden_size: int = spec(_default("hidden_size"), doc="model width D", min=8, max=WIDTH)
    intermediate_size: int = spec(
        _default("intermediate_size"), doc="SwiGLU inner width", min=8, max=WIDTH * 16
    )
    num_layers: int = spec(
        _default("num_layers"), doc="sublayers (mixers + MLPs), Megatron numbering", min=2, max=LAYERS
    )
    recurrent_type: str = spec(
        _default("recurrent_type"),
        doc="recurrent mixer kind placed by hybrid_attention_ratio",
        choices=recurrent_names,
    )
    hybrid_attention_ratio: float = spec(
        _default("hybrid_attention_ratio"), doc="fraction of mixer sublayers that are MLA", min=0.0, max=1.0
    )
    pattern: str | None = spec(
        _default("pattern"), doc=f"explicit sublayer pattern over '{' '.join(MIXERS)}' (overrides the ratio)"
    )
    norm_eps: float = spec(_default("norm_eps"), doc="RMSNorm epsilon", min=0.0, max=1e-2)
    tie_embeddings: bool = spec(
        _default("tie_embeddings"), doc="share the input embedding and the output head"
    )
    init_std: float = spec(_default("init_std"), doc="initialiser standard deviation", min=0.0, max=1.0)
    max_position_embeddings: int = spec(
        _default("max_position_embeddings"), doc="longest position RoPE is set up for", min=1, max=POSITIONS
    )
    kernel_backend: str = spec(
        _default("kernel_backend"),
        doc="kernel backend (mamba_ssm: FLA, with mamba-ssm's chunked Mamba2 scan)",
        choices=KERNEL_BACKENDS,
    )
    mla: MLASpec = spec(doc=MLA.section_doc, factory=MLASpec)  # type: ignore[valid-type]

    def flat(self) -> dict[str, Any]:
        """The keyword arguments of `zebra.models.ZebraConfig` (flat, HF style), named by `config_paths`."""
        paths = config_paths(type(self))
        out = {key: _at(self, path) for path, key in paths.items() if "." not in key}
        out["rope_scaling"] = {"type": "yarn"}
        for path, key in paths.items():  # `rope_scaling.factor`: an entry of `rope_scaling`
            if "." in key:
                outer, _, inner = key.partition(".")
                out[outer][inner] = _at(self, path)
        for mixer in MIXERS.values():  # a mixer without a recipe section: its defaults
            if mixer.config_defaults and not (mixer.section and mixer.fields):
                out.update(mixer.config_kwargs())
        return out

    def to_config(self, **overrides: Any):
        """Build the `ZebraConfig` (imports transformers)."""
        from zebra.models import ZebraConfig

        return ZebraConfig(**{**self.flat(), **overrides})

    @classmethod
    def overrides_from_config(cls, config: Mapping[str, Any]) -> dict[str, Any]:
        """Typed `{"model.<path>": value}` overrides that give a recipe the shapes of a ZebraConfig dict (an
        export's config.json): the inverse of `flat`, over the keys `flat` fills (a dotted key is an entry of a
        dict, e.g. `rope_scaling.factor`). Keys the config lacks are left out; the values are the config's own,
        checked by the recipe's schema as `--set` values are."""
        out: dict[str, Any] = {}
        for path, key in config_paths(cls).items():
            outer, _, inner = key.partition(".")
            held = (config.get(outer) or {}) if inner else config
            if (inner or key) in held:
                out[f"model.{path}"] = held[inner or key]
        return out


ModelSpec = make_dataclass(
    "ModelSpec",
    [
        (m.section, (section := mixer_section(m)), spec(doc=m.section_doc, factory=section))
        for m in MIXERS.values()
        if m.section and m.fields and m is not MLA  # MLA's section: a field of `_ModelFields`, first
    ]
    + [("teacher", TeacherSpec, spec(doc="Llama teacher (KV-cache comparison only)", factory=TeacherSpec))],
    bases=(_ModelFields,),
    kw_only=True,
)
ModelSpec.__doc__ = "The `model` section: sizes, the layer pattern, and one section per mixer."
ModelSpec.__module__ = __name__


_NOT_CONFIG_KEYS = ("teacher",)  # a recipe section that is no part of the model config


def config_paths(cls: type = ModelSpec) -> dict[str, str]:
    """`{recipe path under model: ZebraConfig key}` of every model field (a dotted key: an entry of a dict)."""
    paths = {}
    for f in fields(cls):
        if f.name in _NOT_CONFIG_KEYS:
            continue
        if not is_dataclass(f.default_factory if f.default_factory is not MISSING else None):
            paths[f.name] = CONFIG_KEYS.get(f.name, f.name)
            continue
        mixer = next(m for m in MIXERS.values() if m.section == f.name and m.fields)
        paths.update(
            {f"{f.name}.{sub.name}": mixer.config_key(sub.name) for sub in fields(f.default_factory)}
        )
    return paths


def _at(section: Any, path: str) -> Any:
    """The value at a dotted path (`mla.num_heads`) under a section."""
    for name in path.split("."):
        section = getattr(section, name)
    return section


@dataclass(kw_only=True)
class DataSpec:
    tokenizer: str = spec("meta-llama/Llama-3.2-1B", doc="HF tokenizer name or path, or 'byte' (built in)")
    paths: list[DataPath] = spec(
        doc="data folders, Megatron prefixes or @sample, each 'PATH' or 'PATH:weight' (blended)", factory=list
    )
    mock: bool = spec(False, doc="train on random tokens (no data needed)")
    split: str = spec("99,1,0", doc="train,valid,test split weights over documents")
    seq_len: int = spec(2048, doc="training sequence length", min=8, max=POSITIONS)
    num_workers: int = spec(2, doc="DataLoader worker processes", min=0, max=64)
    order: str = spec(
        "megatron",
        doc="sample order: megatron (GPTDataset windows, shuffled with train.seed) or fla (a convert-fla "
        "folder's chunks in FLA's training order)",
        choices=("megatron", "fla"),
    )


@dataclass(kw_only=True)
class TrainSpec:
    max_steps: int = spec(76294, doc="optimizer steps (train_iters)", min=1, max=STEPS)
    global_batch_size: int = spec(448, doc="sequences per optimizer step, over all ranks", min=1, max=BATCH)
    micro_batch_size: int = spec(8, doc="sequences per rank per forward/backward", min=1, max=BATCH)
    lr: float = spec(2e-4, doc="peak learning rate", min=0.0, max=1.0)
    min_lr: float = spec(2e-5, doc="final learning rate of the decay", min=0.0, max=1.0)
    warmup_steps: int = spec(200, doc="linear warm-up steps", min=0, max=STEPS)
    lr_decay_style: str = spec("cosine", doc="decay after warm-up", choices=("cosine", "linear", "constant"))
    weight_decay: float = spec(
        0.01, doc="AdamW weight decay (not on norms, biases, A_log, dt_bias)", min=0.0, max=1.0
    )
    adam_beta1: float = spec(0.9, doc="AdamW beta1", min=0.0, max=1.0)
    adam_beta2: float = spec(0.95, doc="AdamW beta2", min=0.0, max=1.0)
    adam_eps: float = spec(1e-8, doc="AdamW epsilon", min=0.0, max=1.0)
    clip_grad: float = spec(1.0, doc="gradient-norm clip (0 = off)", min=0.0, max=1e6)
    precision: str = spec("bf16", doc="compute dtype (master weights stay fp32)", choices=("bf16", "fp32"))
    seed: int = spec(1234, doc="random seed", min=0, max=2**32 - 1)
    parallel: str = spec(
        "auto",
        doc="data parallelism: auto (DDP below 1B params, else FSDP2), fsdp, ddp",
        choices=("auto", "fsdp", "ddp"),
    )
    activation_checkpointing: bool = spec(False, doc="recompute each sublayer in backward")
    compile: bool = spec(False, doc="torch.compile each sublayer")
    compile_sublayers: str = spec(
        "all",
        doc="with compile: the sublayers compiled, 'all' or pattern letters (e.g. '-' MLPs, '*-' MLA and MLPs)",
    )
    fuse_projections: bool = spec(
        False, doc="one GEMM for the input projections of a sublayer (MLA q/kv down, GDN/KDA q k v gates)"
    )
    optimizer_graph: bool = spec(
        False, doc="replay AdamW's step from a CUDA graph (one GPU or DDP, not FSDP)"
    )
    fp8: bool = spec(
        False, doc="torchao float8 Linear layers (zebra-llama[fp8], sm89+ GPU; fp8_recipe: the scales)"
    )
    fp8_sublayers: str = spec(
        "-",
        doc="with fp8: the sublayers in float8, pattern letters ('-': the MLPs, the widest GEMMs) or 'all'",
    )
    fp8_recipe: str = spec(
        "tensorwise",
        doc="with fp8: torchao's scales (tensorwise: one per tensor, the faster; rowwise: one per row)",
        choices=("tensorwise", "rowwise", "rowwise_with_gw_hp"),
    )
    log_interval: int = spec(10, doc="steps between log lines", min=1, max=STEPS)
    eval_interval: int = spec(1000, doc="steps between validation losses (0 = never)", min=0, max=STEPS)
    eval_steps: int = spec(10, doc="validation batches per evaluation", min=1, max=BATCH)
    save_interval: int = spec(1000, doc="steps between checkpoints (0 = only at the end)", min=0, max=STEPS)
    keep_last: int = spec(3, doc="checkpoints to keep", min=1, max=10_000)
    nonfinite: str = spec(
        "skip", doc="on a non-finite loss or gradient: skip the step or stop", choices=("skip", "stop")
    )
    max_nonfinite_skips: int = spec(10, doc="stop after this many skipped steps in a row", min=1, max=STEPS)
    export: bool = spec(True, doc="write an HF export of the final weights to <run>/export")
    init: str = spec(
        "", doc="export folder the weights start from at step 0 (e.g. `zebra upcycle`'s; '' = random init)"
    )


@dataclass(kw_only=True)
class DistillSpec:
    """Knowledge distillation from a frozen teacher: the loss is kl_weight * tau^2 * KL(p_teacher || p_student)
    (forward KL at temperature tau, summed over the vocabulary, averaged over tokens) + ce_weight * CE."""

    teacher: str = spec(
        "", doc="teacher: HF folder or hub id, .gguf file or dense Megatron checkpoint ('' = no distillation)"
    )
    kl_weight: float = spec(1.0, doc="weight of the KL term", min=0.0, max=1000.0)
    ce_weight: float = spec(0.0, doc="weight of the student's cross-entropy on the data", min=0.0, max=1000.0)
    temperature: float = spec(
        1.0, doc="softmax temperature tau of both models in the KL", min=0.05, max=100.0
    )
    stage: str = spec(
        "kd",
        doc="kd: end-to-end KL on the logits; ild: teacher-forced intermediate-layer distillation (per-layer "
        "outputs and mixer outputs against the teacher's)",
        choices=("kd", "ild"),
    )
    ild_norm: str = spec(
        "l2",
        doc="ild: per-token distance, l2 (the L2 norm, as published) or mse (mean squared error)",
        choices=("l2", "mse"),
    )
    ild_params: str = spec(
        "all",
        doc="ild: what trains, all (every parameter the loss reaches, as published) or mixers (the new mixers "
        "alone: MLPs, norms and embeddings frozen)",
        choices=("all", "mixers"),
    )
    copied_lr_scale: float = spec(
        1.0,
        doc="learning rate of what was copied from the teacher (MLPs, norms, embeddings, head) as a fraction of "
        "train.lr; the new mixers (upcycle.json of train.init) train at train.lr",
        min=0.0,
        max=1.0,
    )
    mixer_only_steps: int = spec(
        0,
        doc="the first steps train the new mixers alone (the copied weights wait at learning rate 0)",
        min=0,
        max=STEPS,
    )
    top_k: int = spec(
        0,
        doc="kd: the KL over the teacher's top-k tokens and one bucket for the rest of its mass (0 = the whole "
        "vocabulary)",
        min=0,
        max=VOCAB,
    )
    logit_cache: str = spec(
        "",
        doc="kd with top_k: a folder where the teacher's top-k logits of each sequence are kept and read back "
        "('' = recompute them)",
    )


@dataclass(kw_only=True)
class LaunchSpec:
    launcher: str = spec("local", doc="where to run", choices=("local", "docker", "slurm"))
    gpus: int = spec(0, doc="GPUs per node (0 = all visible, CPU if none; slurm: the nodes')", min=0, max=64)
    nodes: int = spec(1, doc="nodes", min=1, max=100_000)
    image: str = spec("rocm/primus:v25.10", doc="container image (docker launcher, slurm with container)")
    gpu_vendor: str = spec(
        "auto",
        doc="GPUs handed to containers (auto: this machine's, else the image's)",
        choices=("auto", "amd", "nvidia"),
    )
    mounts: list[str] = spec(doc="extra container mounts, each HOST[:CONTAINER][:ro]", factory=list)
    shm_size: str = spec("64g", doc="container /dev/shm size")
    container_python: str = spec("python3", doc="Python inside the container (with torch)")
    container_setup: str = spec("", doc="shell command run in the container before the ranks start")
    container_init: bool = spec(
        True, doc="run an init (docker --init) as the container's PID 1: it forwards signals"
    )
    container: bool = spec(False, doc="slurm: run each node's ranks in the container image")
    partition: str = spec("", doc="Slurm partition")
    account: str = spec("", doc="Slurm account")
    qos: str = spec("", doc="Slurm QoS")
    time: str = spec("", doc="Slurm time limit, e.g. 24:00:00 (empty: the partition's limit)")
    cpus_per_task: int = spec(0, doc="Slurm CPUs per task (0: the cluster's default)", min=0, max=100_000)
    sbatch_extra: list[str] = spec(doc="extra sbatch flags, e.g. --exclusive", factory=list)
    env: list[str] = spec(doc="environment variables passed through to ranks (names only)", factory=list)
    secret_env: list[str] = spec(
        doc="environment variables passed to ranks as secrets: never shown, logged or written (names only)",
        factory=list,
    )


@dataclass(kw_only=True)
class Recipe:
    name: str = spec("", doc="recipe name")
    description: str = spec("", doc="one line saying what this recipe trains")
    model: ModelSpec = spec(doc="architecture", factory=ModelSpec)
    data: DataSpec = spec(doc="data and tokenizer", factory=DataSpec)
    train: TrainSpec = spec(doc="optimisation and checkpointing", factory=TrainSpec)
    distill: DistillSpec = spec(doc="distillation from a teacher (off by default)", factory=DistillSpec)
    launch: LaunchSpec = spec(doc="launcher defaults", factory=LaunchSpec)
    source: str = field(default="", metadata={"doc": "file this recipe was loaded from", "internal": True})
    overridden: list[str] = field(
        default_factory=list, metadata={"doc": "dotted keys --set gave (errors name --set)", "internal": True}
    )

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as plain data (what `recipes show` prints and runs save)."""
        d = asdict(self)
        d.pop("source")
        d.pop("overridden")
        d["data"]["paths"] = [str(p) for p in self.data.paths]  # each as written (resolved: PREFIX:WEIGHT)
        return d
