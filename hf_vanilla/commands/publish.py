"""Write a complete Hub folder (weights, code, tokenizer, model card) and optionally upload it.

    hf-vanilla publish MODEL OUTPUT [--bleu B --chrf C --signature SIG] [--push-to-hub REPO | --dry-run]

    hf-vanilla publish runs/model hub/en-de --bleu 38.1 --chrf 63.0 \
        --signature "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0" --repo-id me/vanilla-en-de
"""

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="folder with the trained model and its tokenizer")
    parser.add_argument("output", help="the Hub folder to write")
    parser.add_argument("--repo-id", default=None, help="Hub repository named in the card (default: --push-to-hub)")
    parser.add_argument("--push-to-hub", metavar="REPO", help="upload the folder to this Hub repository")
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="list the files that would be written, write nothing")
    parser.add_argument("--source-language", default="en")
    parser.add_argument("--target-language", default="de")
    parser.add_argument("--dataset", action="append", help="Hub dataset id(s) the model was trained on")
    parser.add_argument("--bleu", type=float)
    parser.add_argument("--chrf", type=float)
    parser.add_argument("--signature", help="the sacreBLEU signature of --bleu")
    parser.add_argument("--test-set", default="Multi30k test2016")
    parser.add_argument("--hyperparameters", help="JSON file of training hyper-parameters for the card")
    parser.add_argument("--card-template", help="Jinja template of the card (default: the package's model_card.md)")


def run(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from ..hub import CardInfo, dry_run, load_hyperparameters, push_folder, write_hub_folder
    from ..loading import load_model

    card = CardInfo(
        repo_id=args.repo_id or args.push_to_hub or CardInfo.repo_id,
        source_language=args.source_language,
        target_language=args.target_language,
        bleu=args.bleu,
        chrf=args.chrf,
        signature=args.signature,
        test_set=args.test_set,
        hyperparameters=load_hyperparameters(args.hyperparameters),
        **({"datasets": args.dataset} if args.dataset else {}),
    )
    model = load_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if args.dry_run:
        print("\n".join(dry_run(model, tokenizer, card, template_path=args.card_template)))
        return
    files = write_hub_folder(model, tokenizer, args.output, card, template_path=args.card_template)
    print(f"wrote {len(files)} files to {args.output}: {', '.join(path.name for path in files)}")
    if args.push_to_hub:
        try:
            print(f"uploaded: {push_folder(args.output, args.push_to_hub, private=args.private)}")
        except RuntimeError as error:
            sys.exit(f"error: {error}")
