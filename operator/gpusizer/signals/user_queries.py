"""The PromQL users write in a WorkloadSizing: parsed, and confined to the object's namespace.

Like prom-label-proxy, every vector and matrix selector gets the tenant matcher
(`namespace="<the object's namespace>"`); a matcher the user wrote on that label is replaced,
never combined, so a query naming another namespace reads nothing from it. The parsed tree is
rewritten, not the text, so string literals, functions, modifiers and subqueries stay intact,
and the result is parsed again and checked, so a rewriting bug fails closed. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

import promql_parser as pp

from gpusizer.api.v1alpha1 import WorkloadSizingSpec
from gpusizer.settings import Tenancy
from gpusizer.signals.queries import promql_string

WAKE_FIELD = "spec.scaleToZero.wakeQuery"
QUEUE_FIELD = "spec.metrics.queueQuery"

MAX_STRUCTURE = 256
"""Brackets and operators a query may hold. The parser is recursive native code: a query
nested thousands deep overflows its stack and kills the whole process, so depth is bounded
before it is parsed."""

_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_STRUCTURE = set("([{+-*/%^=<>!")
_OPS = (  # MatchOp is not hashable
    (pp.MatchOp.Equal, "="),
    (pp.MatchOp.NotEqual, "!="),
    (pp.MatchOp.Re, "=~"),
    (pp.MatchOp.NotRe, "!~"),
)


class InvalidQuery(ValueError):
    """PromQL that cannot be parsed or confined; the message names the spec field."""


@dataclass(frozen=True)
class UserQueries:
    """A spec's queries as they are sent, and what confining them overrode."""

    wake: str | None
    queue: str | None
    restricted: tuple[str, ...] = ()


def _structure(promql: str) -> int:
    """Brackets and operator characters outside string literals: a bound on parse depth."""
    count, quote, escaped = 0, "", False
    for ch in promql:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote != "`":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'`":
            quote = ch
        elif ch in _STRUCTURE:
            count += 1
    return count


def parse(promql: str) -> pp.Expr:
    """Parse, refusing what the parser cannot take safely; errors are ValueError."""
    if _structure(promql) > MAX_STRUCTURE:
        raise ValueError(f"more than {MAX_STRUCTURE} brackets and operators")
    return pp.parse(promql)


def _matcher(m: pp.Matcher) -> str:
    op = next(text for op, text in _OPS if op == m.op)
    return f"{m.name}{op}{promql_string(m.value)}"


def _duration(delta: timedelta) -> str:
    return "-" + pp.display_duration(-delta) if delta < timedelta(0) else pp.display_duration(delta)


def _modifiers(vs: pp.VectorSelector) -> str:
    text = ""
    if vs.at is not None:
        if vs.at.type == pp.AtModifierType.Start:
            text += " @ start()"
        elif vs.at.type == pp.AtModifierType.End:
            text += " @ end()"
        elif vs.at.at is not None:
            text += f" @ {vs.at.at.timestamp():.3f}"
    if vs.offset is not None:
        text += f" offset {_duration(vs.offset)}"
    return text


def _confine(vs: pp.VectorSelector, label: str, namespace: str) -> tuple[str, list[pp.Matcher]]:
    """The selector's PromQL with the tenant matcher forced, and the matchers it replaced."""
    if vs.matchers.or_matchers:
        raise ValueError("`or` between matchers is not PromQL that Prometheus accepts")
    kept: list[str] = []
    replaced: list[pp.Matcher] = []
    for m in vs.matchers.matchers:
        if m.name != label:
            kept.append(_matcher(m))
        elif not (m.op in (pp.MatchOp.Equal, pp.MatchOp.Re) and m.value == namespace):
            replaced.append(m)
    name = ""
    if vs.name is not None:
        if _IDENTIFIER.fullmatch(vs.name):
            name = vs.name
        else:
            kept.insert(0, f"__name__={promql_string(vs.name)}")
    kept.append(f"{label}={promql_string(namespace)}")
    return f"{name}{{{','.join(kept)}}}{_modifiers(vs)}", replaced


def _unconfined(expr: pp.Expr, label: str, namespace: str) -> bool:
    """Whether any selector lacks exactly the one tenant matcher."""
    bad = False

    def visit(node: pp.Expr) -> bool:
        nonlocal bad
        if isinstance(node, pp.VectorSelector):
            on_label = [m for m in node.matchers.matchers if m.name == label]
            exact = [m for m in on_label if m.op == pp.MatchOp.Equal and m.value == namespace]
            bad = bool(node.matchers.or_matchers) or len(on_label) != 1 or len(exact) != 1
        return not bad

    pp.walk(expr, pre_visit=visit)
    return bad


def restrict(promql: str, namespace: str, label: str = "namespace") -> tuple[str, list[str]]:
    """The query with every selector confined to `namespace`, and the matchers (as PromQL)
    that asked for more and were overridden. Raises ValueError for malformed PromQL."""
    replaced: list[pp.Matcher] = []

    def rewrite(node: pp.Expr) -> pp.Expr | None:
        if not isinstance(node, pp.VectorSelector):
            return None
        text, dropped = _confine(node, label, namespace)
        replaced.extend(dropped)
        return pp.parse(text)

    rewritten = pp.transform(parse(promql), post_visit=rewrite).prettify()
    if _unconfined(pp.parse(rewritten), label, namespace):
        raise ValueError("the query could not be confined to its namespace")
    unique = dict.fromkeys(_matcher(m) for m in replaced)
    return rewritten, list(unique)


def _one(field: str, promql: str, namespace: str, tenancy: Tenancy) -> tuple[str, tuple[str, ...]]:
    try:
        if tenancy.allow_cross_namespace:
            parse(promql)
            return promql, ()
        rewritten, replaced = restrict(promql, namespace, tenancy.label)
    except ValueError as exc:
        shown = promql if len(promql) <= 200 else promql[:200] + "..."
        raise InvalidQuery(f"{field}: parse error: {exc} in {shown!r}") from exc
    return rewritten, tuple(
        f"{field}: selects {m}; restricted to {tenancy.label}={promql_string(namespace)}"
        for m in replaced
    )


def user_queries(spec: WorkloadSizingSpec, namespace: str, tenancy: Tenancy) -> UserQueries:
    """The spec's wake and queue queries as they will be sent. Raises InvalidQuery."""
    wake = queue = None
    restricted: tuple[str, ...] = ()
    if spec.scale_to_zero.wake_query:
        wake, notes = _one(WAKE_FIELD, spec.scale_to_zero.wake_query, namespace, tenancy)
        restricted += notes
    if spec.metrics.queue_query:
        queue, notes = _one(QUEUE_FIELD, spec.metrics.queue_query, namespace, tenancy)
        restricted += notes
    return UserQueries(wake=wake, queue=queue, restricted=restricted)
