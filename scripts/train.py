"""Train a translation model with the paper's recipe (same as `hf-vanilla train`).

python scripts/train.py --config configs/quickstart.yaml [--max_steps 8000 --output_dir runs/x ...]
accelerate launch --config_file configs/accelerate_multi_gpu.yaml scripts/train.py --config ...
"""

import sys

from hf_vanilla.cli import main


if __name__ == "__main__":
    main(["train", *sys.argv[1:]])
