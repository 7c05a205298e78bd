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
