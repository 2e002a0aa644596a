"""`python -m hf_vanilla ...` is the `hf-vanilla` command (handy under `accelerate launch -m hf_vanilla train`)."""

from .commands import main


if __name__ == "__main__":
    main()
