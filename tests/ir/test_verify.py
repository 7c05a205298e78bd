"""The verifier and the builder reject malformed graphs with messages that
name the value, the spec line and what is wrong."""

import attrs
import pytest

from attnmeta.compiler.ir import (
    DType,
    Graph,
    Node,
    Op,
    ParseError,
    Region,
    SpecBuilder,
    SpecError,
    TensorType,
    VerifyError,
    parse,
    verify,
)


def small():
    b = SpecBuilder("small")
    x = b.input("x", DType.int32, ["bs"], fill=1)
    with b.in_graph():
        y = b.cumsum(x, name="y")
    b.outputs(y=y)
    return b.build()


def test_well_formed_graph_passes():
    g = small()
    assert verify(g) is g


def test_undefined_value_names_it_and_origin():
    g = small()
    bad = attrs.evolve(g.nodes[0], inputs=("nope",), origin="backends/x.py:7")
    with pytest.raises(VerifyError) as e:
        verify(attrs.evolve(g, nodes=(bad,)))
    assert "%nope" in str(e.value) and "backends/x.py:7" in str(e.value)


def test_declared_type_must_match_op_rule():
    g = small()
    wrong = attrs.evolve(g.nodes[0], type=TensorType(DType.int32, ("bs",)))  # cumsum gives bs + 1
    with pytest.raises(VerifyError, match=r"declared type i32\[bs\]@device but the op rule gives i32\[bs \+ 1\]"):
        verify(attrs.evolve(g, nodes=(wrong,)))


def test_duplicate_definition_and_bad_output_all_reported():
    g = small()
    dup = attrs.evolve(g.nodes[0], name="x")
    with pytest.raises(VerifyError) as e:
        verify(attrs.evolve(g, nodes=(dup,)))
    assert len(e.value.problems) == 2  # %x twice, and output y now names nothing
    assert any("defined twice" in p for p in e.value.problems)
    assert any("output y names undefined value %y" in p for p in e.value.problems)


def test_attribute_schema_checked():
    n = Node("z", Op.cumsum, ("x",), {"leading_zero": 1}, TensorType(DType.int32, ("bs + 1",)), Region.in_graph)
    g = small()
    with pytest.raises(VerifyError, match="attribute leading_zero must be <class 'bool'>"):
        verify(attrs.evolve(g, nodes=(n,), outputs=()))


def test_builder_reports_shape_error_at_spec_line():
    b = SpecBuilder("bad")
    x = b.input("x", DType.int32, ["bs"], fill=1)
    y = b.input("y", DType.int32, ["bs + 1"], fill=1)
    with pytest.raises(SpecError, match=r"tests/ir/test_verify.py:\d+: ewise operands differ in shape"):
        b.ewise("add", x, y)


def test_builder_rejects_reused_name():
    b = SpecBuilder("bad")
    b.input("x", DType.int32, ["bs"], fill=1)
    with pytest.raises(SpecError, match="value name %x is used twice"):
        b.input("x", DType.int32, ["bs"], fill=1)


def test_pool_cannot_have_fill():
    from attnmeta.compiler.ir import Input, Role

    g = Graph("g", (Input("t", TensorType(DType.int32, ("R", "L")), Role.pool, fill=0),), (), ())
    with pytest.raises(VerifyError, match="pool input %t cannot have a fill value"):
        verify(g)


def test_parse_error_names_line():
    with pytest.raises(ParseError, match="line 2"):
        parse('graph "g" [] {\n  %a = frobnicate() : i32[1]@device in_graph\n}\n')


def test_a_batch_input_not_per_row_is_refused():
    """Padding fills rows: an input of extent bs + 1 would keep a stale last entry at every padded size."""
    b = SpecBuilder("rows")
    x = b.input("indptr", DType.int32, ["bs + 1"], fill=0)
    with b.in_graph():
        y = b.copy(x)
    b.outputs(y=y)
    with pytest.raises(VerifyError, match=r"batch input %indptr has leading extent bs \+ 1: batch inputs are "
                                          r"per-request rows"):
        b.build()


GOOD = 'graph "g" [] {\n  input %x: i32[bs]@device batch fill=1\n  %y = cumsum(%x) {leading_zero=true} : ' \
       'i32[bs + 1]@device in_graph\n  output y = %y\n}\n'


@pytest.mark.parametrize(("text", "match"), [
    (GOOD.replace("\n}\n", "\n"), r"line 4, column 16: graph 'g' is not closed: expected '\}' after this line"),
    (GOOD + "  %z = copy(%y) : i32[bs + 1]@device in_graph\n",
     r"line 6, column 3: text after the closing '\}' of graph 'g' \(line 5\)"),
    (GOOD.replace("%y = cumsum", "%9y = cumsum"), r"line 3, column 4: expected a value name after %"),
    (GOOD.replace("cumsum(%x)", "cumsum(%x-1)"), r"line 3, column 17: expected ',' or '\)' after an operand"),
    (GOOD.replace("cumsum", "cumsom", 1), r"line 3, column 8: unknown op 'cumsom'"),
    (GOOD.replace("leading_zero=true", "leading_zero=yes"),
     r"line 3, column 33: cumsum attribute leading_zero must be true or false, got 'yes'"),
    (GOOD.replace("@device batch", "@gpu batch"), r"line 2, column 21: a placement must be one of"),
    (GOOD.replace("in_graph\n", "in_graph extra\n"), r"line 3, column \d+: unexpected text at the end of the line"),
    ('graph g [] {\n}\n', r"line 1, column 7: expected a \"quoted string\""),
])
def test_parse_errors_name_line_and_column(text, match):
    with pytest.raises(ParseError, match=match) as e:
        parse(text)
    assert "^" in str(e.value)  # a caret under the column


def test_spec_errors_name_the_spec_line():
    b = SpecBuilder("bad")
    x = b.input("x", DType.int32, ["bs"], fill=1)
    with pytest.raises(SpecError, match=r"tests/ir/test_verify.py:\d+: unknown op 'frobnicate'"):
        b.op("frobnicate", x)
    other = SpecBuilder("other").input("x", DType.int32, ["bs"], fill=1)
    with pytest.raises(SpecError, match=r"test_verify.py:\d+: cumsum operand %x is not a value of spec 'bad'"):
        b.cumsum(other)
    with pytest.raises(SpecError, match=r"operand 3 is not a value of spec 'bad'.*b.full"):
        b.op(Op.cumsum, 3)
    with pytest.raises(SpecError, match=r"test_verify.py:\d+: 'neg' has a negative extent in shape i32\[-2\]"):
        b.input("neg", DType.int32, [-2], fill=0)
    with pytest.raises(SpecError, match=r"test_verify.py:\d+: .*negative extent"):
        b.full(0, [-1], DType.int32)
    with pytest.raises(SpecError, match=r"field y is bound to 'y', not a value of spec 'bad'"):
        b.outputs(y="y")
