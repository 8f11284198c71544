"""Build hook: ship the top-level recipe folders (tasks/, train/, eval/) inside the wheel.

The YAML files live at the repository root so users can read and copy them; the wheel
carries a copy under ``anchored_reasoning/_builtin/`` so an installed package still finds
the built-in tasks, recipes and suites (see ``anchored_reasoning/resources.py``).
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

RECIPE_DIRS = ("tasks", "train", "eval")


class BuildPyWithRecipes(build_py):
    def run(self):
        super().run()
        root = Path(__file__).parent
        for name in RECIPE_DIRS:
            src = root / name
            if not src.is_dir():
                continue
            dst = Path(self.build_lib) / "anchored_reasoning" / "_builtin" / name
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithRecipes})
