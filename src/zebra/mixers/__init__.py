"""The mixer registry: every sublayer kind a layer pattern can hold, one torch-free module per kind.

`zebra.mixers.spec` defines `MixerSpec` (what a kind is, for every part of zebra) and the table `MIXERS`; each
built-in kind registers its spec in its own module here (`mamba2`, `gdn`, `kda`, `gla`, `mla`, `mlp`), in the
order `MIXERS` lists them (`delta_rule` holds the adapter parts GDN and KDA share). Adding a mixer:
docs/models.md.
"""

from zebra.mixers.spec import (
    ATTENTION,
    MIXERS,
    MLP,
    Blocker,
    ConfigField,
    FLAAdapter,
    MegatronAdapter,
    MixerSpec,
    NativeAdapter,
    NativeTensor,
    UpcycleAdapter,
    keeps_tokens,
    mixer_named,
    mixer_spec,
    recurrent_names,
    recurrent_spec,
    register_mixer,
    resolve,
)

# the import order is the registry's order (`MIXERS`, `recurrent_names`)
# isort: off
from zebra.mixers.mamba2 import MAMBA2, mamba_num_heads
from zebra.mixers.gdn import GDN
from zebra.mixers.kda import KDA
from zebra.mixers.gla import GLA
from zebra.mixers.mla import MLA
from zebra.mixers.mlp import SWIGLU
# isort: on

__all__ = [
    "ATTENTION",
    "GDN",
    "GLA",
    "KDA",
    "MAMBA2",
    "MIXERS",
    "MLA",
    "MLP",
    "SWIGLU",
    "Blocker",
    "ConfigField",
    "FLAAdapter",
    "MegatronAdapter",
    "MixerSpec",
    "NativeAdapter",
    "NativeTensor",
    "UpcycleAdapter",
    "keeps_tokens",
    "mamba_num_heads",
    "mixer_named",
    "mixer_spec",
    "recurrent_names",
    "recurrent_spec",
    "register_mixer",
    "resolve",
]
