"""The Zebra model library: configuration, the hybrid model, its decode cache and HF export code.

    from zebra.models import ZebraConfig, ZebraForCausalLM, ZebraCache
    model = ZebraForCausalLM(recipe.model.to_config())

Importing this package registers `model_type = "zebra"` with transformers' AutoConfig, AutoModel and
AutoModelForCausalLM. See docs/models.md.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from zebra.models.cache_zebra import ZebraCache
from zebra.models.configuration_zebra import ZebraConfig
from zebra.models.modeling_zebra import ZebraForCausalLM, ZebraModel, ZebraPreTrainedModel

AutoConfig.register(ZebraConfig.model_type, ZebraConfig, exist_ok=True)
AutoModel.register(ZebraConfig, ZebraModel, exist_ok=True)
AutoModelForCausalLM.register(ZebraConfig, ZebraForCausalLM, exist_ok=True)

__all__ = ["ZebraCache", "ZebraConfig", "ZebraForCausalLM", "ZebraModel", "ZebraPreTrainedModel"]
