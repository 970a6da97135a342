"""Recipes: one YAML per trainable configuration, with `extends:` inheritance and `--set` overrides.

from zebra.recipes import load_recipe
recipe = load_recipe("1b-gdn-pure", overrides=["train.lr=3e-4"])
config = recipe.model.to_config()      # a zebra.models.ZebraConfig
"""

from zebra.recipes.loader import builtin_dir, dump_recipe, find_recipe, list_recipes, load_recipe
from zebra.recipes.schema import DataSpec, LaunchSpec, ModelSpec, Recipe, TrainSpec

__all__ = [
    "DataSpec",
    "LaunchSpec",
    "ModelSpec",
    "Recipe",
    "TrainSpec",
    "builtin_dir",
    "dump_recipe",
    "find_recipe",
    "list_recipes",
    "load_recipe",
]
