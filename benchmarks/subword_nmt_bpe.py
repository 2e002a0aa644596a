"""A BPE of subword-nmt's kind (Sennrich et al. 2016), the kind Wu et al. 2021 trained on, for the published
recipe's `--tokenizer`: merges learnt within the words between spaces, each word's last symbol marked `</w>`, by the
`tokenizers` library's own trainer, a fixed number of merges over both sides of the training split (subword-nmt's
`learn_joint_bpe_and_vocab.py -s N`, pairs seen at least twice). Saved as a `PreTrainedTokenizerFast` with the
recipe's special tokens and `</s>` after every sequence, as the recipe's own BPE is (`hf_vanilla.tokenization`).

    python -m benchmarks.subword_nmt_bpe --merges 10000 --output runs/subword-nmt-10k
    hf-vanilla train --config configs/multi30k_wu2021.yaml --tokenizer runs/subword-nmt-10k ...

The recipe trains a byte-level BPE of 10k entries instead (any text, no unknown tokens); docs/training.md compares
the two on the validation split.
"""

import argparse
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from hf_vanilla.data import BUNDLED_CORPORA, find_split_file
from hf_vanilla.text_files import stream_lines
from hf_vanilla.tokenization import SPECIAL_TOKENS, with_end_of_sequence


WORD_END = "</w>"


def alphabet_size(texts: list[str]) -> int:
    """The trainer's initial symbols: every character met, and each word-final one again with `</w>`."""
    words = {word for text in texts for word in text.split()}
    return len({character for word in words for character in word}) + len({word[-1] for word in words})


def train_subword_nmt_bpe(texts: list[str], merges: int) -> PreTrainedTokenizerFast:
    """`merges` merges learnt over `texts`, as subword-nmt learns them (characters never met are `<unk>`)."""
    special = list(SPECIAL_TOKENS.values())
    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"], end_of_word_suffix=WORD_END))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.BPEDecoder(suffix=WORD_END)
    trainer = trainers.BpeTrainer(
        vocab_size=len(special) + alphabet_size(texts) + merges,
        min_frequency=2,
        special_tokens=special,
        end_of_word_suffix=WORD_END,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return with_end_of_sequence(tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="multi30k-tok", choices=list(BUNDLED_CORPORA))
    parser.add_argument("--languages", nargs=2, default=["en", "de"])
    parser.add_argument("--merges", type=int, default=10000)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    folder, pattern = BUNDLED_CORPORA[args.data]
    texts = [
        line
        for language in args.languages
        for line in stream_lines(find_split_file(folder, "train", language, pattern))
    ]
    tokenizer = train_subword_nmt_bpe(texts, args.merges)
    tokenizer.save_pretrained(args.output)
    print(f"{len(tokenizer)} entries ({args.merges} merges) from {len(texts)} sentences: {args.output}")


if __name__ == "__main__":
    main()
