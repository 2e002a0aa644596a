"""Every form of parallel data `--data` takes, built here offline, and the errors for what it does not take."""

import gzip
import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hf_vanilla.data import load_parallel_corpus
from hf_vanilla.text_files import stream_lines


SPLIT_PAIRS = {
    "train": [("A dog runs.", "Ein Hund rennt."), ("Two cats sleep.", "Zwei Katzen schlafen."), ("Hi", "Hallo")],
    "validation": [("A bird sings.", "Ein Vogel singt.")],
    "test": [("The sun shines.", "Die Sonne scheint."), ("Rain.", "Regen.")],
}


def expected(split: str) -> dict[str, list[str]]:
    return {"source": [en for en, _ in SPLIT_PAIRS[split]], "target": [de for _, de in SPLIT_PAIRS[split]]}


def assert_corpus(corpus) -> None:
    assert sorted(corpus) == ["test", "train", "validation"]
    for split in SPLIT_PAIRS:
        assert corpus[split].column_names == ["source", "target"]
        assert corpus[split].to_dict() == expected(split), split


def translation_rows(split: str, pair=("en", "de")) -> list[dict]:
    """run_translation.py's and the Hub's shape: {"translation": {"en": ..., "de": ...}}."""
    return [{"translation": {pair[0]: en, pair[1]: de}} for en, de in SPLIT_PAIRS[split]]


def write(path, text: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)


def write_jsonl(path, rows: list[dict]):
    write(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode())


def write_parquet(path, rows: list[dict]):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


# Aligned text files (the form before this module could take the others)


def test_corpus_folder_strips_lines_and_handles_crlf(tmp_path):
    for split in ("train", "val", "test2016"):
        write(tmp_path / f"{split}.en.gz", b" A dog runs.\r\nTwo cats\tsleep. \n")
        write(tmp_path / f"{split}.de", b"Ein Hund rennt.\r\nZwei Katzen schlafen.\n")
    corpus = load_parallel_corpus(tmp_path, "en", "de")
    assert corpus["validation"]["source"] == ["A dog runs.", "Two cats\tsleep."]
    assert corpus["test"]["target"] == ["Ein Hund rennt.", "Zwei Katzen schlafen."]


def test_a_changed_file_is_read_again_not_served_from_the_cache(tmp_path):
    for split in ("train", "val", "test"):
        write(tmp_path / f"{split}.en", b"one\n")
        write(tmp_path / f"{split}.de", b"eins\n")
    assert load_parallel_corpus(tmp_path, "en", "de")["train"]["source"] == ["one"]
    write(tmp_path / "train.en", b"uno\n")
    assert load_parallel_corpus(tmp_path, "en", "de")["train"]["source"] == ["uno"]


def test_misaligned_files_name_both_files_and_counts(tmp_path):
    for split in ("train", "val", "test"):
        write(tmp_path / f"{split}.en", b"one\ntwo\nthree\n")
        write(tmp_path / f"{split}.de", b"eins\nzwei\n")
    with pytest.raises(ValueError, match=r"train\.en has 3 lines but .*train\.de has 2"):
        load_parallel_corpus(tmp_path, "en", "de")
    write(tmp_path / "train.de", b"")
    write(tmp_path / "train.en", b"")
    with pytest.raises(ValueError, match="Empty parallel files"):
        load_parallel_corpus(tmp_path, "en", "de")


def test_invalid_utf8_names_the_line(tmp_path):
    write(tmp_path / "bad.de.gz", "gut\nschön\n".encode() + b"\xff\xfe kaputt\n")
    with pytest.raises(ValueError, match=r"bad\.de\.gz: line 3 is not valid UTF-8"):
        list(stream_lines(tmp_path / "bad.de.gz"))
    for split in ("train", "val", "test"):
        write(tmp_path / f"{split}.en", b"a\nb\nc\n")
        write(tmp_path / f"{split}.de.gz", "gut\nschön\n".encode() + b"\xff\xfe kaputt\n")
    with pytest.raises(ValueError, match=r"train\.de\.gz: line 3 is not valid UTF-8"):
        load_parallel_corpus(tmp_path, "en", "de")


def test_a_folder_without_parallel_data_names_what_was_looked_for_and_the_accepted_forms(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here")
    with pytest.raises(
        FileNotFoundError, match=r"No parallel data in .*train\.en\[\.gz\].*Accepted: a bundled corpus"
    ):
        load_parallel_corpus(tmp_path, "en", "de")
    write(tmp_path / "train.en", b"a\n")  # the source side alone
    with pytest.raises(FileNotFoundError, match="No train file for language 'de'"):
        load_parallel_corpus(tmp_path, "en", "de")


def test_a_missing_path_is_not_taken_for_a_hub_id(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_parallel_corpus(str(tmp_path / "missing"), "en", "de")


# TSV pairs


def test_tsv_folder(tmp_path):
    for split, name in (("train", "train.tsv.gz"), ("validation", "dev.tsv"), ("test", "test.tsv")):
        write(tmp_path / name, "".join(f"{en}\t{de}\r\n" for en, de in SPLIT_PAIRS[split]).encode())
    assert_corpus(load_parallel_corpus(tmp_path, "en", "de"))


def test_tsv_line_without_exactly_two_fields_is_an_error_naming_it(tmp_path):
    write(tmp_path / "train.tsv", b"a\tb\nonly one field\n")
    with pytest.raises(ValueError, match=r"train\.tsv: line 2 has 1 tab-separated fields"):
        load_parallel_corpus(None, "en", "de", splits=("train",), data_files={"train": str(tmp_path / "train.tsv")})


# JSON lines (run_translation.py), parquet and arrow shards, save_to_disk, dataset repositories


def test_folder_of_json_lines_in_run_translation_shape(tmp_path):
    for split in SPLIT_PAIRS:
        write_jsonl(tmp_path / f"{split}.json", translation_rows(split))
    assert_corpus(load_parallel_corpus(tmp_path, "en", "de"))
    # the reverse direction reads the other fields
    reverse = load_parallel_corpus(tmp_path, "de", "en")
    assert reverse["test"]["source"] == expected("test")["target"]


def test_named_files_per_split_in_mixed_formats(tmp_path):
    write_jsonl(tmp_path / "a" / "train.jsonl.gz", translation_rows("train"))
    write_parquet(tmp_path / "b" / "dev.parquet", [{"en": en, "de": de} for en, de in SPLIT_PAIRS["validation"]])
    write(tmp_path / "c" / "test.tsv", "".join(f"{en}\t{de}\n" for en, de in SPLIT_PAIRS["test"]).encode())
    files = {
        "train": tmp_path / "a/train.jsonl.gz",
        "validation": tmp_path / "b/dev.parquet",
        "test": tmp_path / "c/test.tsv",
    }
    assert_corpus(load_parallel_corpus(None, "en", "de", data_files={k: str(v) for k, v in files.items()}))
    write(tmp_path / "x.en", b"A dog.\n")
    with pytest.raises(ValueError, match="unknown format '.en'"):
        load_parallel_corpus(None, "en", "de", splits=("train",), data_files={"train": str(tmp_path / "x.en")})


def test_parquet_shards_with_one_column_per_language(tmp_path):
    rows = [{"en": en, "de": de, "id": i} for i, (en, de) in enumerate(SPLIT_PAIRS["train"])]
    write_parquet(tmp_path / "data" / "train-00000-of-00002.parquet", rows[:2])
    write_parquet(tmp_path / "data" / "train-00001-of-00002.parquet", rows[2:])
    for split in ("validation", "test"):
        write_parquet(
            tmp_path / "data" / f"{split}-00000-of-00001.parquet",
            [{"en": e, "de": d, "id": 0} for e, d in SPLIT_PAIRS[split]],
        )
    assert_corpus(load_parallel_corpus(tmp_path, "en", "de"))


def test_arrow_shards(tmp_path):
    for split in SPLIT_PAIRS:
        table = pa.Table.from_pylist(translation_rows(split))
        (tmp_path / split).mkdir()
        with pa.OSFile(str(tmp_path / split / "data-00000-of-00001.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
    assert_corpus(load_parallel_corpus(tmp_path, "en", "de"))


def test_save_to_disk_folder_with_split_aliases(tmp_path):
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(translation_rows("train")),
            "dev": datasets.Dataset.from_list(translation_rows("validation")),
            "test": datasets.Dataset.from_list(translation_rows("test")),
        }
    ).save_to_disk(tmp_path / "saved")
    assert_corpus(load_parallel_corpus(tmp_path / "saved", "en", "de"))


# wmt14's README declares one config per language pair, each with its parquet shards per split.
WMT14_README = (
    "---\nconfigs:\n"
    + "".join(
        f"- config_name: {pair}\n  data_files:\n"
        + "".join(f"  - split: {split}\n    path: {pair}/{split}-*\n" for split in SPLIT_PAIRS)
        for pair in ("de-en", "fr-en")
    )
    + "---\n# A local look-alike of the wmt14 dataset repository\n"
)


def make_wmt14_like(folder, pairs: dict | None = None) -> None:
    """A dataset repository laid out as `wmt14` on the Hub: a README declaring one config per language pair, parquet
    shards of {"translation": {"de": ..., "en": ...}} rows under `<config>/`."""
    pairs = pairs or SPLIT_PAIRS
    (folder).mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text(WMT14_README)
    for split, rows in pairs.items():
        hub_rows = [{"translation": {"de": de, "en": en}} for en, de in rows]
        half = max(1, len(hub_rows) // 2)
        shards = [hub_rows[:half], hub_rows[half:]] if split == "train" else [hub_rows]
        for index, shard in enumerate(shards):
            write_parquet(folder / "de-en" / f"{split}-{index:05d}-of-{len(shards):05d}.parquet", shard)
        french = [{"translation": {"fr": "Bonjour.", "en": "Hello."}}]
        write_parquet(folder / "fr-en" / f"{split}-00000-of-00001.parquet", french)


def test_local_dataset_repository_laid_out_as_wmt14_with_a_config_name(tmp_path):
    make_wmt14_like(tmp_path / "wmt14")
    assert_corpus(load_parallel_corpus(tmp_path / "wmt14", "en", "de", config="de-en"))
    with pytest.raises(ValueError, match=r"holds \['en', 'fr'\], not both 'en' and 'de'"):
        load_parallel_corpus(tmp_path / "wmt14", "en", "de", config="fr-en")


def test_two_repositories_of_the_same_name_never_share_a_cache(tmp_path):
    make_wmt14_like(tmp_path / "a" / "wmt14")
    more = {split: rows * 3 for split, rows in SPLIT_PAIRS.items()}
    make_wmt14_like(tmp_path / "b" / "wmt14", more)
    assert len(load_parallel_corpus(tmp_path / "a" / "wmt14", "en", "de", config="de-en")["train"]) == 3
    assert len(load_parallel_corpus(tmp_path / "b" / "wmt14", "en", "de", config="de-en")["train"]) == 9


def test_limits_keep_the_first_pairs(tmp_path):
    make_wmt14_like(tmp_path / "wmt14")
    corpus = load_parallel_corpus(tmp_path / "wmt14", "en", "de", config="de-en", max_examples={"train": 2})
    assert corpus["train"]["source"] == expected("train")["source"][:2]


# What the loaders refuse, each in one message naming the fix


def test_columns_without_the_languages_and_null_rows_are_clear_errors(tmp_path):
    for split in SPLIT_PAIRS:
        write_jsonl(tmp_path / "a" / f"{split}.jsonl", [{"text": "x", "label": 1}])
        write_jsonl(
            tmp_path / "b" / f"{split}.jsonl", [*translation_rows(split), {"translation": {"en": "x", "de": None}}]
        )
    with pytest.raises(
        ValueError, match=r"no 'translation' column and no 'en'/'de' columns \(columns: \['text', 'label'\]\)"
    ):
        load_parallel_corpus(tmp_path / "a", "en", "de")
    with pytest.raises(ValueError, match=r"translation\.de has 1 empty \(null\) rows; fill or drop them"):
        load_parallel_corpus(tmp_path / "b", "en", "de")


def test_a_repository_without_a_split_names_the_ones_it_has(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", translation_rows("train"))
    with pytest.raises(
        ValueError, match=r"has no validation split \(it has \['train'\]\); give one with --validation_file"
    ):
        load_parallel_corpus(tmp_path, "en", "de")


def test_an_unreachable_hub_id_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="no such local folder, and the Hub dataset could not be loaded"):
        load_parallel_corpus("no-such-user/no-such-dataset", "en", "de")
