from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cerebro_db.errors import CerebroError
from cerebro_db.names import TableName, quote_ident, split_column_list, split_identifier


@pytest.mark.parametrize("text,parts", [
    ("t", ["t"]), ("MyTable", ["mytable"]), ("public.T", ["public", "t"]),
    ('"My Table"', ["My Table"]), ('"s p"."t""q"', ["s p", 't"q']), ("  x  ", ["x"]),
    ("_a$1", ["_a$1"]), ('"a.b"', ["a.b"]), ("émile", ["émile"]),
])
def test_split_identifier(text, parts):
    assert split_identifier(text, "t") == parts


@pytest.mark.parametrize("text", [
    "", "a b", "a;drop table x", "x)--", '"unterminated', '""', "a.", ".a", "1abc", "a..b",
    "a'b", "a/*c*/", "x" * 64,
])
def test_bad_identifiers(text):
    with pytest.raises(CerebroError) as e:
        split_identifier(text, "output_table")
    assert e.value.sqlstate == "42602"
    assert "output_table" in e.value.message


def test_table_name_sql_is_always_quoted():
    t = TableName.parse('public."Weird ""X"""', "t")
    assert t.sql == '"public"."Weird ""X"""'
    assert t.with_suffix("_summary", "t").sql == '"public"."Weird ""X""_summary"'
    # the text shown (and stored in summaries) names the same table when parsed again
    shown = str(t.with_suffix("_summary", "t"))
    assert shown == 'public."Weird ""X""_summary"'
    assert TableName.parse(shown, "t").name == 'Weird "X"_summary'
    assert str(TableName.parse("s.plain", "t").with_suffix("_info", "t")) == "s.plain_info"
    with pytest.raises(CerebroError):
        TableName.parse("a.b.c", "t")
    with pytest.raises(CerebroError):
        TableName.parse("x" * 60, "t").with_suffix("_summary", "t")


def test_column_lists():
    assert split_column_list('x, "Y z", w', "c") == ["x", "Y z", "w"]
    assert split_column_list('"a,b"', "c") == ["a,b"]
    for bad in ("x,,y", "x, x", "t.x", "x y", ""):
        with pytest.raises(CerebroError):
            split_column_list(bad, "c")


@given(st.text(max_size=40))
def test_any_text_either_parses_to_quoted_sql_or_is_rejected(text):
    try:
        parts = split_identifier(text, "t")
    except CerebroError as e:
        assert e.sqlstate in ("42602", "22004")
        return
    for p in parts:
        q = quote_ident(p)
        assert q.startswith('"') and q.endswith('"')
        assert q[1:-1].replace('""', "") .count('"') == 0


def test_display_name_quotes_only_where_needed_and_parses_back():
    from cerebro_db.names import TableName, display_name

    assert display_name('"public"."t_1"', "t") == "public.t_1"
    assert display_name('"s"."Mixed Case"', "t") == 's."Mixed Case"'
    assert display_name('"t"', "t") == "t"
    for text in ('"public"."t_1"', '"S x"."a""b"', '"select"'):
        a, b = TableName.parse(text, "t"), TableName.parse(display_name(text, "t"), "t")
        assert (a.schema, a.name) == (b.schema, b.name)
