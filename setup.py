"""Build glue beyond pyproject.toml: ship three top-level files inside the package, the card template
(model_card.md) and the locks of tested versions (constraints.txt, constraints-newest.txt: `hf-vanilla env` reads
them).

All stay at the top of the repository, where people edit them and pip reads the lock; wheels get a copy next to
`hf_vanilla/env.py` (`hf_vanilla.env.shipped_file` looks there first, then at the top of a checkout).
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


SHIPPED_FILES = ("model_card.md", "constraints.txt", "constraints-newest.txt")


class BuildPyWithCardTemplate(build_py):
    def run(self):
        super().run()
        # An editable install builds into an empty folder and reads the template from the checkout instead.
        target = Path(self.build_lib, "hf_vanilla")
        if target.is_dir():
            for name in SHIPPED_FILES:
                shutil.copyfile(Path(__file__).with_name(name), target / name)


setup(cmdclass={"build_py": BuildPyWithCardTemplate})
