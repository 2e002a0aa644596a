"""Build glue beyond pyproject.toml: ship the top-level card template, model_card.md, inside the package.

The template stays at the top of the repository, where people edit it; wheels get a copy next to `hf_vanilla/hub.py`
(`hf_vanilla.hub.default_card_template` looks there first, then at the top of a checkout).
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithCardTemplate(build_py):
    def run(self):
        super().run()
        # An editable install builds into an empty folder and reads the template from the checkout instead.
        target = Path(self.build_lib, "hf_vanilla")
        if target.is_dir():
            shutil.copyfile(Path(__file__).with_name("model_card.md"), target / "model_card.md")


setup(cmdclass={"build_py": BuildPyWithCardTemplate})
