"""Train the joint source+target BPE tokenizer and save it as a `tokenizer.json` folder.

    python scripts/train_tokenizer.py --files ../shared/data/multi30k/train.en.gz ../shared/data/multi30k/train.de.gz \
        --vocab-size 10000 --output runs/tokenizer
"""

import argparse

from hf_vanilla.data import iter_lines
from hf_vanilla.tokenization import train_bpe_tokenizer, unknown_token_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", nargs="+", required=True, help="training text, source and target (.gz or plain)")
    parser.add_argument("--vocab-size", type=int, default=10000)
    parser.add_argument("--min-frequency", type=int, default=2)
    parser.add_argument("--output", required=True, help="folder to write tokenizer.json and its config into")
    parser.add_argument("--check", nargs="*", default=[], help="held-out files to report round-trip and unk rate on")
    args = parser.parse_args()

    tokenizer = train_bpe_tokenizer(iter_lines(args.files), args.vocab_size, args.min_frequency)
    tokenizer.save_pretrained(args.output)
    print(f"saved a {len(tokenizer)}-entry tokenizer to {args.output}")
    for path in args.check:
        lines = list(iter_lines([path]))
        exact = sum(tokenizer.decode(tokenizer(line)["input_ids"], skip_special_tokens=True) == line for line in lines)
        unk = unknown_token_rate(tokenizer, lines)
        print(f"{path}: round trip exact {exact}/{len(lines)} ({exact / len(lines):.4%}), unknown tokens {unk:.4%}")


if __name__ == "__main__":
    main()
