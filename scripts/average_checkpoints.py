"""Average the weights of several checkpoints into a normal `save_pretrained` folder (same as `hf-vanilla average`).

    python scripts/average_checkpoints.py runs/x/checkpoint-7000 runs/x/checkpoint-7500 runs/x/checkpoint-8000 \
        --output runs/x/averaged
    python scripts/average_checkpoints.py --last 10 --from runs/x --output runs/x/averaged
"""

import sys

from hf_vanilla.cli import main


if __name__ == "__main__":
    main(["average", *sys.argv[1:]])
