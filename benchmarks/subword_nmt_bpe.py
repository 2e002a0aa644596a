"""A BPE of subword-nmt's kind (Sennrich et al. 2016), the kind Wu et al. 2021 trained on, for the published
recipe's `--tokenizer`: merges learnt by subword-nmt itself (`learn_bpe`, as its `learn_joint_bpe_and_vocab.py -s N`
learns them over both sides of the training split: within the words between spaces, each word's last symbol marked
`</w>`, pairs seen at least twice, ties broken by the pair's text), then applied by the `tokenizers` library's BPE
model in the same order. Saved as a `PreTrainedTokenizerFast` with the recipe's special tokens and `</s>` after every
sequence, as the recipe's own BPE is (`hf_vanilla.tokenization`).

    python -m benchmarks.subword_nmt_bpe --merges 10000 --output runs/subword-nmt-10k
    hf-vanilla train --config configs/multi30k_wu2021.yaml --tokenizer runs/subword-nmt-10k ...

subword-nmt learns, not the `tokenizers` library's `BpeTrainer`, because the trainer breaks ties between pairs of
equal count in an order that changes from one process to the next (huggingface/tokenizers#1794), so two runs of the
same command made different BPEs; subword-nmt makes the same one every time.

The recipe trains a byte-level BPE of 10k entries instead (any text, no unknown tokens); docs/training.md compares
the two on the validation split.
"""

import argparse
import io
from pathlib import Path

from subword_nmt.learn_bpe import learn_bpe
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hf_vanilla.data import BUNDLED_CORPORA, find_split_file
from hf_vanilla.text_files import stream_lines
from hf_vanilla.tokenization import SPECIAL_TOKENS, with_end_of_sequence


WORD_END = "</w>"


def word_symbols(texts: list[str]) -> list[str]:
    """The symbols subword-nmt starts from: every character met, and each word-final one again with `</w>`."""
    words = {word for text in texts for word in text.split()}
    return sorted({character for word in words for character in word} | {word[-1] + WORD_END for word in words})


def learn_merges(texts: list[str], merges: int) -> list[tuple[str, str]]:
    """The first `merges` merges subword-nmt learns over `texts` (fewer where no pair is seen twice any more)."""
    codes = io.StringIO()
    learn_bpe(texts, codes, merges, min_frequency=2)
    lines = codes.getvalue().splitlines()[1:]  # the first line is the codes' version header
    return [tuple(line.split(" ")) for line in lines]


def train_subword_nmt_bpe(texts: list[str], merges: int) -> PreTrainedTokenizerFast:
    """`merges` merges learnt over `texts`, as subword-nmt learns them (characters never met are `<unk>`)."""
    learnt = learn_merges(texts, merges)
    # Two merges may make the same symbol ("ab" + "c" and "a" + "bc"): it is one entry.
    entries = dict.fromkeys(
        [*SPECIAL_TOKENS.values(), *word_symbols(texts), *(left + right for left, right in learnt)]
    )
    model = models.BPE(
        vocab={entry: index for index, entry in enumerate(entries)},
        merges=learnt,
        unk_token=SPECIAL_TOKENS["unk_token"],
        end_of_word_suffix=WORD_END,
    )
    tokenizer = Tokenizer(model)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS.values()))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.BPEDecoder(suffix=WORD_END)
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
