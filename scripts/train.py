"""`hf-vanilla train` as a script path, for launchers that want one: accelerate launch scripts/train.py --config ..."""

import sys

from hf_vanilla.commands import main


if __name__ == "__main__":
    main(["train", *sys.argv[1:]])
