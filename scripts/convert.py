"""Convert a checkpoint of another implementation into an hf_vanilla model folder.

python scripts/convert.py marian Helsinki-NLP/opus-mt-en-de runs/opus-mt-en-de-vanilla
python scripts/convert.py marian path/to/marian-folder out/
"""

import argparse

from hf_vanilla.conversion import convert_marian_folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=["marian"], help="what the source checkpoint is")
    parser.add_argument("source", help="a saved MarianMT folder or Hub id")
    parser.add_argument("output", help="where to write the hf_vanilla folder")
    args = parser.parse_args()
    convert_marian_folder(args.source, args.output)
    print(f"converted {args.source} -> {args.output}")


if __name__ == "__main__":
    main()
