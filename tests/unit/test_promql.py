"""Confining a WorkloadSizing's PromQL to its namespace: query -> rewritten query tables.

The parser prints matchers sorted by name, so the tenant matcher lands in label order.
"""

from __future__ import annotations

import promql_parser as pp
import pytest
from gpusizer.api.v1alpha1 import WorkloadSizingSpec
from gpusizer.signals.user_queries import (
    MAX_STRUCTURE,
    QUEUE_FIELD,
    WAKE_FIELD,
    InvalidQuery,
    Tenancy,
    restrict,
    user_queries,
)

NS = 'namespace="llm"'

REWRITES = [
    # (query, rewritten, matchers reported as overridden)
    ("up", f"up{{{NS}}}", []),
    ('up{namespace="llm"}', f"up{{{NS}}}", []),
    ('up{namespace=~"llm"}', f"up{{{NS}}}", []),
    ('up{namespace="other"}', f"up{{{NS}}}", ['namespace="other"']),
    ('up{namespace=~"llm|other"}', f"up{{{NS}}}", ['namespace=~"llm|other"']),
    ('up{namespace!="llm"}', f"up{{{NS}}}", ['namespace!="llm"']),
    ('up{namespace=~".+"}', f"up{{{NS}}}", ['namespace=~".+"']),
    ('up{namespace=""}', f"up{{{NS}}}", ['namespace=""']),
    (
        'up{namespace="a",namespace="b"}',
        f"up{{{NS}}}",
        ['namespace="a"', 'namespace="b"'],
    ),
    ('up{job="x",namespace="llm"}', f'up{{job="x",{NS}}}', []),
    # functions and ranges
    (
        'rate(http_requests_total{namespace="other"}[5m])',
        f"rate(http_requests_total{{{NS}}}[5m])",
        ['namespace="other"'],
    ),
    ("histogram_quantile(0.9, rate(b[1m]))", f"histogram_quantile(0.9, rate(b{{{NS}}}[1m]))", []),
    (
        'absent(nothing{namespace="other"})',
        f"absent(nothing{{{NS}}})",
        ['namespace="other"'],
    ),
    # aggregations with by / without and parameters that are queries themselves
    (
        'sum by (pod) (vllm:num_requests_waiting{namespace="other"})',
        f"sum by (pod) (vllm:num_requests_waiting{{{NS}}})",
        ['namespace="other"'],
    ),
    ("sum(a) without (gpu)", f"sum without (gpu) (a{{{NS}}})", []),
    (
        'topk(scalar(k{namespace="other"}), v)',
        f"topk(scalar(k{{{NS}}}), v{{{NS}}})",
        ['namespace="other"'],
    ),
    ('count_values("value", a)', f'count_values("value", a{{{NS}}})', []),
    # binary operators and vector matching
    (
        'a / on (pod) group_left (model) b{namespace="x"}',
        f"a{{{NS}}} / on (pod) group_left (model) b{{{NS}}}",
        ['namespace="x"'],
    ),
    (
        "a * ignoring (gpu) group_right b",
        f"a{{{NS}}} * ignoring (gpu) group_right () b{{{NS}}}",
        [],
    ),
    ("a > bool 3", f"a{{{NS}}} > bool 3", []),
    ("a unless b or c", f"a{{{NS}}} unless b{{{NS}}} or c{{{NS}}}", []),
    ("vector(1) and on () a", f"vector(1) and on () a{{{NS}}}", []),
    # subqueries, offsets, @
    (
        "max_over_time((a + b)[10m:1m] offset 5m)",
        f"max_over_time((a{{{NS}}} + b{{{NS}}})[10m:1m] offset 5m)",
        [],
    ),
    ("rate(a[5m] offset -1h)", f"rate(a{{{NS}}}[5m] offset -1h)", []),
    ("a @ start() offset 1m", f"a{{{NS}}} @ start() offset 1m", []),
    ("a @ 1700000000.5", f"a{{{NS}}} @ 1700000000.500", []),
    ("deriv(a[10m:] @ end())", f"deriv(a{{{NS}}}[10m:] @ end())", []),
    # selectors by name matcher
    ('{__name__=~"vllm:.*"}', f'{{__name__=~"vllm:.*",{NS}}}', []),
    (
        '{__name__="up",namespace="kube-system"}',
        f'{{__name__="up",{NS}}}',
        ['namespace="kube-system"'],
    ),
    # string literals holding braces, quotes and matchers are data, not selectors
    (
        'label_replace(a, "dst", "{namespace=\\"other\\"}", "src", "(.*)")',
        f'label_replace(a{{{NS}}}, "dst", "{{namespace=\\"other\\"}}", "src", "(.*)")',
        [],
    ),
    ('a{path="/x}{y\\"z"}', f'a{{{NS},path="/x}}{{y\\"z"}}', []),
    ('a{path=~"\\\\d+"}', f'a{{{NS},path=~"\\\\d+"}}', []),
    # parentheses and unary operators
    ("-(((a)))", f"-(((a{{{NS}}})))", []),
    ("((a) + (b{namespace='o'}))", f"((a{{{NS}}}) + (b{{{NS}}}))", ['namespace="o"']),
    # nothing to confine
    ("vector(1)", "vector(1)", []),
    ("1 + 2", "1 + 2", []),
    ('"just a string"', '"just a string"', []),
]


@pytest.mark.parametrize(("query", "expected", "replaced"), REWRITES)
def test_rewrites(query: str, expected: str, replaced: list[str]) -> None:
    got, overridden = restrict(query, "llm")
    assert got == expected
    assert overridden == replaced


@pytest.mark.parametrize(("query", "expected", "_"), REWRITES)
def test_rewriting_is_idempotent(query: str, expected: str, _: list[str]) -> None:
    assert restrict(expected, "llm") == (expected, [])


def test_other_tenant_label_leaves_namespace_alone() -> None:
    got, overridden = restrict(
        'a{namespace="gpu-operator",exported_namespace="other"}', "llm", "exported_namespace"
    )
    assert got == 'a{exported_namespace="llm",namespace="gpu-operator"}'
    assert overridden == ['exported_namespace="other"']


def test_namespace_value_is_quoted_not_spliced() -> None:
    got, _ = restrict("a", 'x"} or b{c="')
    selectors: list[pp.VectorSelector] = []

    def collect(node: pp.Expr) -> None:
        if isinstance(node, pp.VectorSelector):
            selectors.append(node)

    pp.walk(pp.parse(got), pre_visit=collect)
    assert len(selectors) == 1
    assert [(m.name, m.value) for m in selectors[0].matchers.matchers] == [
        ("namespace", 'x"} or b{c="')
    ]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("sum(rate(", "unclosed left parenthesis"),
        ("rate(a)", "expected type matrix"),
        ("a{", "inside braces"),
        ("", "no expression"),
        ('a{b="c" or d="e"}', "`or` between matchers"),
        ("(" * (MAX_STRUCTURE + 1) + "1" + ")" * (MAX_STRUCTURE + 1), "brackets and operators"),
        ("-" * 20000 + "1", "brackets and operators"),
        ("^".join(["a"] * 20000), "brackets and operators"),
    ],
    ids=["unclosed", "type", "braces", "empty", "or-matchers", "deep", "unary", "pow-chain"],
)
def test_malformed_queries_raise(query: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        restrict(query, "llm")


def test_brackets_inside_strings_do_not_count_towards_the_depth_limit() -> None:
    got, _ = restrict('a{b="' + "(" * 1000 + '"}', "llm")
    assert got.startswith('a{b="((')


def spec(wake: str = "", queue: str = "", enabled: bool = True) -> WorkloadSizingSpec:
    on = enabled and bool(wake)
    return WorkloadSizingSpec.model_validate(
        {
            "targetRef": {"name": "chat"},
            "replicas": {"min": 0 if on else 1, "max": 4, "targetGPUUtilization": 70},
            "scaleToZero": {"enabled": on, "wakeQuery": wake},
            "metrics": {"queueQuery": queue},
        }
    )


def test_user_queries_names_the_field_of_a_malformed_query() -> None:
    with pytest.raises(InvalidQuery, match=r"^spec\.metrics\.queueQuery: parse error: "):
        user_queries(spec(queue="sum(rate("), "llm", Tenancy())
    with pytest.raises(InvalidQuery, match=r"^spec\.scaleToZero\.wakeQuery: parse error: "):
        user_queries(spec(wake="sum(", enabled=False), "llm", Tenancy())


def test_user_queries_reports_what_it_restricted() -> None:
    got = user_queries(
        spec(wake='sum(gateway_pending_requests{namespace="other"})', queue="q"),
        "llm",
        Tenancy(),
    )
    assert got.wake == f"sum(gateway_pending_requests{{{NS}}})"
    assert got.queue == f"q{{{NS}}}"
    assert got.restricted == (
        f'{WAKE_FIELD}: selects namespace="other"; restricted to namespace="llm"',
    )
    assert QUEUE_FIELD not in " ".join(got.restricted)


def test_cross_namespace_allowed_sends_the_query_as_written_but_still_parses_it() -> None:
    allowed = Tenancy(allow_cross_namespace=True)
    got = user_queries(spec(wake='sum(a{namespace="other"})'), "llm", allowed)
    assert (got.wake, got.restricted) == ('sum(a{namespace="other"})', ())
    with pytest.raises(InvalidQuery, match="wakeQuery"):
        user_queries(spec(wake="sum("), "llm", allowed)


def test_empty_queries_are_not_sent() -> None:
    assert user_queries(spec(), "llm", Tenancy()) == user_queries(spec(), "x", Tenancy())
    assert user_queries(spec(), "llm", Tenancy()).wake is None
