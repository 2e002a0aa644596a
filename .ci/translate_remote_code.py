"""Translate standard input with a saved model through the remote code in its folder, as a Python without
hf_vanilla does: `pipeline("translation", model=FOLDER, trust_remote_code=True)`, in batches of 64 sentences.

    python .ci/translate_remote_code.py FOLDER < source.txt > translations.txt
"""

import sys


sys.modules["hf_vanilla"] = None  # `import hf_vanilla` fails, as where the package is not installed

from transformers import pipeline  # noqa: E402


translator = pipeline("translation", model=sys.argv[1], trust_remote_code=True)
for translation in translator(sys.stdin.read().splitlines(), batch_size=64):
    print(translation["translation_text"])
