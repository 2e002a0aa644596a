"""Translate a file or stdin with a saved hf_vanilla model (same as `hf-vanilla translate`).

    python scripts/translate.py runs/model --input source.txt --beam 4 --length-penalty 0.6 \
        --attention-plot attention.png > translations.txt
"""

import sys

from hf_vanilla.cli import main


if __name__ == "__main__":
    main(["translate", *sys.argv[1:]])
