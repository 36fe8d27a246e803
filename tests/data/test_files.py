import json

import pytest

from mutual_rl.data.files import load_problems
from mutual_rl.types import Problem


def _write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_good_rows(tmp_path):
    f = _write_jsonl(
        tmp_path / "b.jsonl",
        [
            {"problem": "1+1=", "answer": "2", "x": 0},
            "",
            {"problem": "2*3=", "answer": 6},
            {"problem": "p", "answer": 2.0},
        ],
    )
    assert load_problems(f, id_offset=10) == [
        Problem(10, "1+1=", "2"),
        Problem(11, "2*3=", "6"),
        Problem(12, "p", "2"),
    ]
    assert (
        load_problems(_write_jsonl(tmp_path / "h.jsonl", [{"problem": "q", "answer": 0.5}]))[0].answer
        == "0.5"
    )


def test_custom_keys_and_skill(tmp_path):
    f = _write_jsonl(tmp_path / "b.jsonl", [{"question": "q1", "solution": "\\frac{1}{2}", "level": 3}])
    assert load_problems(f, problem_key="question", answer_key="solution", skill_key="level") == [
        Problem(0, "q1", "\\frac{1}{2}", "3")
    ]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"question": "q", "answer": "1"},
            r"line 2: key 'problem' is missing; keys present: \['answer', 'question'\]",
        ),
        ({"problem": "q", "answer": None}, r"line 2: key 'answer' is empty or invalid \(None\)"),
        ({"problem": "  ", "answer": "1"}, r"line 2: key 'problem' is empty or invalid"),
        ({"problem": "q", "answer": ""}, r"line 2: key 'answer' is empty"),
        ({"problem": "q", "answer": True}, r"line 2: key 'answer' is empty or invalid \(True\)"),
        ("{not json", r"line 2 is not valid JSON"),
        ("[1, 2]", r"line 2 is a list, expected a JSON object"),
    ],
)
def test_jsonl_bad_row(tmp_path, row, message):
    f = _write_jsonl(tmp_path / "bad.jsonl", [{"problem": "ok", "answer": "1"}, row])
    with pytest.raises(ValueError, match=message) as err:
        load_problems(f)
    assert "bad.jsonl" in str(err.value)


def test_missing_skill_key_names_fix(tmp_path):
    f = _write_jsonl(tmp_path / "b.jsonl", [{"problem": "q", "answer": "1"}])
    with pytest.raises(ValueError, match=r"line 1: key 'level' is missing.*skill_key="):
        load_problems(f, skill_key="level")


def test_json_array_and_json_lines(tmp_path):
    arr = tmp_path / "a.json"
    arr.write_text(json.dumps([{"problem": "a", "answer": 1}, {"problem": "b"}]))
    with pytest.raises(ValueError, match="row 2: key 'answer' is missing"):
        load_problems(arr)
    lines = _write_jsonl(tmp_path / "l.json", [{"problem": "a", "answer": 1}])
    assert load_problems(lines) == [Problem(0, "a", "1")]


def test_unknown_extension_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"unsupported extension '.csv'; supported: .jsonl, .json, .parquet"):
        load_problems(tmp_path / "x.csv")
    with pytest.raises(FileNotFoundError):
        load_problems(tmp_path / "nothing.jsonl")


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    f = tmp_path / "b.parquet"
    pq.write_table(pa.table({"problem": ["1+1=", "2+2="], "answer": [2, None]}), f)
    with pytest.raises(ValueError, match="b.parquet: row 2: key 'answer' is empty or invalid"):
        load_problems(f)
    pq.write_table(pa.table({"problem": ["1+1="], "answer": [2]}), f)
    assert load_problems(f) == [Problem(0, "1+1=", "2")]


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # makes the import fail
    f = tmp_path / "b.parquet"
    f.write_bytes(b"PAR1")
    with pytest.raises(ImportError, match="pip install pyarrow"):
        load_problems(f)


def test_non_utf8_line_names_file_line_and_fix(tmp_path):
    f = tmp_path / "latin1.jsonl"
    f.write_bytes(b'{"problem": "1+1=", "answer": "2"}\n' + '{"problem": "café", "answer": "3"}\n'.encode("latin-1"))
    with pytest.raises(ValueError) as err:
        load_problems(f)
    msg = str(err.value)
    assert msg.startswith(f"{f}: line 2 is not valid UTF-8 (byte 0xe9 at byte 17 of the line")
    assert "re-save it as UTF-8" in msg


def test_non_utf8_json_array_names_the_line(tmp_path):
    f = tmp_path / "a.json"
    f.write_bytes(b'[\n{"problem": "a", "answer": 1},\n{"problem": "\xff", "answer": 2}\n]')
    with pytest.raises(ValueError, match=r"a.json: line 3 is not valid UTF-8 \(byte 0xff at byte 14 of the line"):
        load_problems(f)


def test_byte_order_mark_and_unicode_line_separators(tmp_path):
    f = tmp_path / "bom.jsonl"
    rows = [{"problem": "first\u2028second", "answer": "1"}, {"problem": "b", "answer": "2"}]
    f.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows).encode("utf-8"))
    assert load_problems(f) == [Problem(0, "first\u2028second", "1"), Problem(1, "b", "2")]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\xef\xbb\xbf" + b'{"problem": "a", "answer": 1}\n\xc3(')
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2 is not valid UTF-8 \(byte 0xc3 at byte 1 of the line"):
        load_problems(bad)


def test_malformed_json_array_names_file_and_line(tmp_path):
    f = tmp_path / "a.json"
    f.write_text('[\n{"problem": "a", "answer": 1},\n{"problem": "b" "answer": 2}\n]')
    with pytest.raises(ValueError, match=r"a.json: not valid JSON \(.*line 3 column"):
        load_problems(f)
