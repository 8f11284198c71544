"""Packaging: the repository's top-level YAML folders are installed as package data, without a copy.

``tasks/``, ``train/`` and ``eval/`` stay at the repository root, where users read and copy them;
``package_dir`` maps them to the data-only packages ``anchored_reasoning._builtin.{tasks,train,eval}``, so
the wheel carries the very files of the checkout (no build step copies them; nothing can drift).
``anchored_reasoning/resources.py`` finds them in a checkout or in the installed package.
"""
from setuptools import find_packages, setup

RECIPE_DIRS = ("tasks", "train", "eval")
BUILTIN = "anchored_reasoning._builtin"

setup(
    packages=find_packages(include=["anchored_reasoning", "anchored_reasoning.*"]) + [f"{BUILTIN}.{d}" for d in RECIPE_DIRS],
    package_dir={f"{BUILTIN}.{d}": d for d in RECIPE_DIRS},
    package_data={
        "anchored_reasoning": ["assets/**/*"],
        **{f"{BUILTIN}.{d}": ["*.yaml", "*.yml", "*.md", "accelerate/*.yaml"] for d in RECIPE_DIRS},
    },
    include_package_data=False,
)
