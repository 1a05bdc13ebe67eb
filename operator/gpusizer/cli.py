"""`gpusizer run | simulate | crds`: every setting is a flag with a GPUSIZER_* variable."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import socket
import sys
from collections.abc import Sequence

from gpusizer import __version__, allocator
from gpusizer.settings import DEFAULT_MIG_CONFIG_MAP, DEFAULT_READ_PERIOD_SECONDS

ENV_PREFIX = "GPUSIZER_"
# `recommend` lists every pod of the cluster in one request: a large cluster's list can take
# longer than the operator's per-request limit to start arriving
FLEET_LIST_TIMEOUT_SECONDS = 120.0


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(ENV_PREFIX + name, default)


def _add_run(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "run",
        help="start the operator",
        description=(
            "Start the operator. Kubernetes access is found the usual way (in-cluster service "
            "account, else KUBECONFIG or ~/.kube/config). Every flag can also be set with the "
            "GPUSIZER_* variable named in its help."
        ),
    )
    p.add_argument(
        "--prometheus-url",
        default=_env("PROMETHEUS_URL"),
        help="Prometheus base URL, e.g. http://prometheus:9090 [GPUSIZER_PROMETHEUS_URL]",
    )
    p.add_argument(
        "--prometheus-timeout",
        type=float,
        default=float(_env("PROMETHEUS_TIMEOUT", "10") or 10),
        help="seconds before a Prometheus query counts as failed [GPUSIZER_PROMETHEUS_TIMEOUT]",
    )
    p.add_argument(
        "--prometheus-bearer-token-file",
        default=_env("PROMETHEUS_BEARER_TOKEN_FILE"),
        help="file holding a bearer token for Prometheus [GPUSIZER_PROMETHEUS_BEARER_TOKEN_FILE]",
    )
    p.add_argument(
        "--prometheus-ca-file",
        default=_env("PROMETHEUS_CA_FILE"),
        help="CA bundle to verify Prometheus' TLS certificate [GPUSIZER_PROMETHEUS_CA_FILE]",
    )
    p.add_argument(
        "--prometheus-basic-auth-user",
        default=_env("PROMETHEUS_BASIC_AUTH_USER"),
        help="user for HTTP basic auth to Prometheus [GPUSIZER_PROMETHEUS_BASIC_AUTH_USER]",
    )
    p.add_argument(
        "--prometheus-basic-auth-password-file",
        default=_env("PROMETHEUS_BASIC_AUTH_PASSWORD_FILE"),
        help="file holding the basic auth password [GPUSIZER_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE]",
    )
    p.add_argument(
        "--allow-cross-namespace-queries",
        action="store_true",
        default=(_env("ALLOW_CROSS_NAMESPACE_QUERIES") or "").lower() in ("1", "true", "yes"),
        help="send the wakeQuery and queueQuery of a WorkloadSizing as written; by default "
        "every selector in them is confined to the object's namespace "
        "[GPUSIZER_ALLOW_CROSS_NAMESPACE_QUERIES]",
    )
    p.add_argument(
        "--tenant-label",
        default=_env("TENANT_LABEL", "namespace"),
        help="the label that confines those queries to the object's namespace, e.g. "
        "exported_namespace where tenants' series are scraped without honorLabels "
        "[GPUSIZER_TENANT_LABEL]",
    )
    p.add_argument(
        "--catalog-file",
        default=_env("CATALOG_FILE"),
        help="YAML overriding the GPU catalog (prices, products, throughput weights) "
        "[GPUSIZER_CATALOG_FILE]",
    )
    p.add_argument(
        "--rightsizing-period",
        type=float,
        default=float(_env("RIGHTSIZING_PERIOD", "60") or 60),
        help="seconds between reads of GPU memory and of the GPUs' power (the savings "
        "ledger's energy), and at least between the history queries of right-sizing (a window "
        "is read again once it moved by 5 %% of itself, if that is longer: every 3 minutes for "
        "an hour) [GPUSIZER_RIGHTSIZING_PERIOD]",
    )
    p.add_argument(
        "--reshape-deadline",
        type=float,
        default=float(_env("RESHAPE_DEADLINE", "600") or 600),
        help="seconds a slice change may take to become ready before it is rolled back "
        "[GPUSIZER_RESHAPE_DEADLINE]",
    )
    p.add_argument(
        "--reshape-min-interval",
        type=float,
        default=float(_env("RESHAPE_MIN_INTERVAL", "3600") or 3600),
        help="fewest seconds between two slice changes of one workload "
        "[GPUSIZER_RESHAPE_MIN_INTERVAL]",
    )
    p.add_argument(
        "--mig-config-map",
        default=_env("MIG_CONFIG_MAP", DEFAULT_MIG_CONFIG_MAP),
        help="NAMESPACE/NAME of the ConfigMap mig-manager reads its mig-parted configs from "
        "(the GPU Operator's ClusterPolicy migManager.config.name): GPUPartitionings write "
        "their layouts there; only served cluster-wide, without --namespace "
        "[GPUSIZER_MIG_CONFIG_MAP]",
    )
    p.add_argument(
        "--mig-config-settle",
        type=float,
        default=float(_env("MIG_CONFIG_SETTLE", "60") or 60),
        help="seconds between writing a layout into that ConfigMap and setting a node's "
        "nvidia.com/mig.config to it: mig-manager reads a mounted copy the kubelet refreshes "
        "about a minute later [GPUSIZER_MIG_CONFIG_SETTLE]",
    )
    p.add_argument(
        "--prediction-tolerance",
        type=float,
        default=float(_env("PREDICTION_TOLERANCE", "0.2") or 0.2),
        help="share by which the throughput measured on a slice after a move may differ from "
        "the one predicted before it is reported as an Event [GPUSIZER_PREDICTION_TOLERANCE]",
    )
    p.add_argument(
        "--sync-period",
        type=float,
        default=float(_env("SYNC_PERIOD", "15") or 15),
        help="seconds between decisions for each workload [GPUSIZER_SYNC_PERIOD]",
    )
    p.add_argument(
        "--read-period",
        type=float,
        default=_env("READ_PERIOD"),  # argparse converts a string default with `type`
        help="seconds between reads of the metrics, at most the sync period: every signal of "
        "every pod is read once per sync period, and in between only the pods whose GPU "
        "utilisation or queue moved, whose workloads are decided on that read; default: "
        f"{DEFAULT_READ_PERIOD_SECONDS:g}, or the sync period if shorter [GPUSIZER_READ_PERIOD]",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(_env("METRICS_PORT", "8080") or 8080),
        help="port of the operator's own /metrics [GPUSIZER_METRICS_PORT]",
    )
    p.add_argument(
        "--health-address",
        default=_env("HEALTH_ADDRESS", "0.0.0.0:8081"),
        help="host:port of the liveness probe /healthz [GPUSIZER_HEALTH_ADDRESS]",
    )
    p.add_argument(
        "--namespace",
        action="append",
        default=[n for n in (_env("NAMESPACES") or "").split(",") if n],
        help="watch only this namespace; repeatable; default: all [GPUSIZER_NAMESPACES, "
        "comma-separated]",
    )
    p.add_argument(
        "--activator-service",
        default=_env("ACTIVATOR_SERVICE"),
        help="NAMESPACE/NAME of the activator's Service (`gpusizer activator`): workloads with "
        "scaleToZero.activator.enabled are routed to its ready replicas while they have none "
        "of their own; unset: no activator is installed [GPUSIZER_ACTIVATOR_SERVICE]",
    )
    p.add_argument(
        "--peering",
        default=_env("PEERING"),
        help="kopf peering name: replicas sharing it elect one active operator; unset runs "
        "standalone [GPUSIZER_PEERING]",
    )
    p.add_argument(
        "--lease",
        default=_env("LEASE"),
        help="NAMESPACE/NAME of the coordination.k8s.io Lease that the replica in charge holds "
        "(with --peering: only its holder acts); default: the pod's namespace and the peering "
        "name [GPUSIZER_LEASE]",
    )
    p.add_argument(
        "--log-format",
        choices=["json", "plain", "full"],
        default=_env("LOG_FORMAT", "json"),
        help="log line format: json, plain (the message), or full (plain after the time, logger "
        "and level) [GPUSIZER_LOG_FORMAT]",
    )
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=_env("LOG_LEVEL", "info"),
        help="[GPUSIZER_LOG_LEVEL]",
    )
    p.set_defaults(func=_run)


# Young collections every 50,000 allocations rather than 700: with the default, a full read's
# decoded JSON and a decision's temporaries were alive at a young collection often enough to be
# promoted, and full collections (every object of thousands of workloads, with the GIL held)
# stalled the event loop (figures: bench/README.md).
GC_THRESHOLDS = (50_000, 20, 100)


def tune_garbage_collector() -> None:
    """What is alive once the operator is imported (modules, classes, functions) is frozen out
    of every collection, and young collections are rarer."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _run(args: argparse.Namespace) -> int:
    from gpusizer.main import run_operator
    from gpusizer.partition.objects import ConfigMapRef
    from gpusizer.settings import (
        OperatorSettings,
        PrometheusSettings,
        Tenancy,
        read_period_seconds,
    )

    if not args.prometheus_url:
        print(
            "gpusizer run: --prometheus-url (or GPUSIZER_PROMETHEUS_URL) is required",
            file=sys.stderr,
        )
        return 2
    try:
        read_period = read_period_seconds(args.read_period, args.sync_period)
    except ValueError as exc:
        print(f"gpusizer run: {exc}", file=sys.stderr)
        return 2
    activator_service = None
    if args.activator_service:
        namespace, _, name = args.activator_service.partition("/")
        if not namespace or not name:
            print(
                "gpusizer run: --activator-service must be NAMESPACE/NAME, got "
                f"{args.activator_service!r}",
                file=sys.stderr,
            )
            return 2
        activator_service = (namespace, name)
    lease = None
    if args.peering:
        lease_name = args.lease or _default_lease(args.peering)
        namespace, _, name = (lease_name or "").partition("/")
        if not namespace or not name:
            print(
                "gpusizer run: --lease must be NAMESPACE/NAME"
                + (f", got {args.lease!r}" if args.lease else " outside a pod (with --peering)"),
                file=sys.stderr,
            )
            return 2
        lease = (namespace, name)
    try:
        ConfigMapRef.parse(args.mig_config_map)
    except ValueError as exc:
        print(f"gpusizer run: --mig-config-map: {exc}", file=sys.stderr)
        return 2
    basic_auth = None
    if args.prometheus_basic_auth_user:
        if not args.prometheus_basic_auth_password_file:
            print(
                "gpusizer run: --prometheus-basic-auth-user needs "
                "--prometheus-basic-auth-password-file",
                file=sys.stderr,
            )
            return 2
        with open(args.prometheus_basic_auth_password_file, encoding="utf-8") as f:
            basic_auth = (args.prometheus_basic_auth_user, f.read().strip())
    settings = OperatorSettings(
        prometheus=PrometheusSettings(
            url=args.prometheus_url.rstrip("/"),
            timeout_seconds=args.prometheus_timeout,
            bearer_token_file=args.prometheus_bearer_token_file,
            ca_file=args.prometheus_ca_file,
            basic_auth=basic_auth,
        ),
        tenancy=Tenancy(
            label=args.tenant_label, allow_cross_namespace=args.allow_cross_namespace_queries
        ),
        sync_period_seconds=args.sync_period,
        read_period_seconds=read_period,
        metrics_port=args.metrics_port,
        peering=args.peering,
        lease=lease,
        peering_namespace=args.namespace[0] if args.peering and args.namespace else None,
        catalog_file=args.catalog_file,
        rightsizing_period_seconds=args.rightsizing_period,
        reshape_deadline_seconds=args.reshape_deadline,
        min_reshape_interval_seconds=args.reshape_min_interval,
        activator_service=activator_service,
        partitioning=not args.namespace,
        mig_config_map=args.mig_config_map,
        mig_config_settle_seconds=args.mig_config_settle,
        prediction_tolerance=args.prediction_tolerance,
    )
    configure_logging(args.log_format, args.log_level)
    if not allocator.pin_mmap_threshold():
        logging.getLogger(__name__).info("not glibc: its malloc is left as it is")
    allocator.limit_arenas()  # before kopf and the operator start their threads
    tune_garbage_collector()
    run_operator(settings, args.namespace, args.health_address)
    return 0


def _default_lease(peering: str) -> str | None:
    """The pod's namespace and the peering's name; None outside a pod."""
    from gpusizer.lease import pod_namespace

    namespace = pod_namespace()
    return f"{namespace}/{peering}" if namespace else None


def _add_activator(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "activator",
        help="start the activator: hold requests for workloads at zero, wake them, forward",
        description=(
            "Start the activator. While a workload with scaleToZero.activator.enabled has no "
            "ready replica, the operator points its Service here: each request is held, the "
            "operator is told at once, and the requests are forwarded in arrival order when a "
            "replica is ready. Kubernetes access as for `gpusizer run`. Every flag can also be "
            "set with the GPUSIZER_* variable named in its help."
        ),
    )
    p.add_argument(
        "--replica",
        default=_env("REPLICA") or socket.gethostname(),
        help="this replica's name (its pod's): the key of what it says it holds on each "
        "WorkloadSizing; default: the host name [GPUSIZER_REPLICA]",
    )
    p.add_argument(
        "--address",
        default=_env("ADDRESS", "0.0.0.0"),
        help="address every port listens on, e.g. the pod's IP [GPUSIZER_ADDRESS]",
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(_env("PORT", "8080") or 8080),
        help="the shared port, routed by Host (service.namespace[.svc...]); each workload also "
        "gets a port of its own from the operator [GPUSIZER_PORT]",
    )
    p.add_argument(
        "--health-port",
        type=int,
        default=int(_env("HEALTH_PORT", "8081") or 8081),
        help="port of /healthz and /readyz [GPUSIZER_HEALTH_PORT]",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(_env("METRICS_PORT", "9090") or 9090),
        help="port of the activator's /metrics [GPUSIZER_METRICS_PORT]",
    )
    p.add_argument(
        "--namespace",
        action="append",
        default=[n for n in (_env("NAMESPACES") or "").split(",") if n],
        help="serve only this namespace's workloads; repeatable; default: all "
        "[GPUSIZER_NAMESPACES, comma-separated]",
    )
    p.add_argument(
        "--drain-seconds",
        type=float,
        default=float(_env("DRAIN_SECONDS", "50") or 50),
        help="after SIGTERM, how long held requests may wait for a replica (then 503); keep it "
        "under the pod's terminationGracePeriodSeconds [GPUSIZER_DRAIN_SECONDS]",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=int(_env("MAX_BODY_BYTES", str(4 * 1024 * 1024)) or 0),
        help="largest request body held (413 above) [GPUSIZER_MAX_BODY_BYTES]",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=float(_env("HEADER_TIMEOUT", "10") or 10),
        help="seconds a client has to send its request headers (408 after) "
        "[GPUSIZER_HEADER_TIMEOUT]",
    )
    p.add_argument(
        "--log-format",
        choices=["json", "plain", "full"],
        default=_env("LOG_FORMAT", "json"),
        help="as for `gpusizer run` [GPUSIZER_LOG_FORMAT]",
    )
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=_env("LOG_LEVEL", "info"),
        help="[GPUSIZER_LOG_LEVEL]",
    )
    p.set_defaults(func=_activator)


def _activator(args: argparse.Namespace) -> int:
    from gpusizer.activator.main import ActivatorSettings, serve
    from gpusizer.activator.proxy import ProxySettings

    if args.max_body_bytes < 1 or args.header_timeout <= 0 or args.drain_seconds < 0:
        print(
            "gpusizer activator: --max-body-bytes must be >= 1, --header-timeout > 0 and "
            "--drain-seconds >= 0",
            file=sys.stderr,
        )
        return 2
    settings = ActivatorSettings(
        replica=args.replica,
        address=args.address,
        shared_port=args.port,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        namespaces=tuple(args.namespace),
        drain_seconds=args.drain_seconds,
        proxy=ProxySettings(
            max_body_bytes=args.max_body_bytes, header_timeout_seconds=args.header_timeout
        ),
    )
    configure_logging(args.log_format, args.log_level)
    allocator.pin_mmap_threshold()  # request bodies held and freed in bursts
    asyncio.run(serve(settings))
    return 0


def _add_crds(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("crds", help="print a CustomResourceDefinition's YAML")
    p.add_argument(
        "--kind",
        choices=["WorkloadSizing", "GPUPartitioning"],
        default="WorkloadSizing",
        help="the custom resource whose CRD to print (default: WorkloadSizing)",
    )
    p.set_defaults(func=_crds)


def _crds(args: argparse.Namespace) -> int:
    from gpusizer.api.crd import KINDS, crd_yaml

    sys.stdout.write(crd_yaml(next(k for k in KINDS if k.kind == args.kind)))
    return 0


def _add_simulate(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gpusizer.sim import command

    p = subparsers.add_parser(
        "simulate",
        help="replay a load trace through gpusizer and the baselines",
        description="Replay a trace through the operator's own policy, HPA, KEDA, static and "
        "the offline optimum, and compare GPU-hours, cost and SLO attainment.",
    )
    command.add_arguments(p)
    p.set_defaults(func=command.run)


def _add_recommend(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "recommend",
        help="report every GPU workload's slice, use and the cheaper slice it should run on",
        description="For every GPU workload in the cluster (with or without a WorkloadSizing): "
        "the current slice, measured peak memory and utilisation, the recommended slice and the "
        "monthly cost now and after. Uses KUBECONFIG (or in-cluster) and Prometheus.",
    )
    p.add_argument(
        "--prometheus-url",
        default=_env("PROMETHEUS_URL"),
        help="Prometheus base URL [GPUSIZER_PROMETHEUS_URL]",
    )
    p.add_argument(
        "--history-seconds",
        type=int,
        default=3600,
        help="window of measured use for workloads without a WorkloadSizing (default 3600)",
    )
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument(
        "--ledger",
        action="store_true",
        help="also show the savings ledger: GPU-hours, cost and kWh each WorkloadSizing used "
        "over the last 24 hours and 7 days against static provisioning for its observed peak, "
        "and the fleet's (read from the operator's own series in Prometheus)",
    )
    p.add_argument(
        "--catalog-file",
        default=_env("CATALOG_FILE"),
        help="YAML overriding the GPU catalog [GPUSIZER_CATALOG_FILE]",
    )
    p.set_defaults(func=_recommend)


def _recommend(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gpusizer.catalog import load_catalog
    from gpusizer.kube import api_client
    from gpusizer.report.fleet import (
        fleet_report,
        ledger_report,
        render_json,
        render_ledger,
        render_table,
    )
    from gpusizer.settings import PrometheusSettings
    from gpusizer.signals.prometheus import PrometheusSource

    if not args.prometheus_url:
        print("gpusizer recommend: --prometheus-url is required", file=sys.stderr)
        return 2
    prometheus = PrometheusSource(PrometheusSettings(url=args.prometheus_url.rstrip("/")))
    catalog = load_catalog(Path(args.catalog_file) if args.catalog_file else None)
    rows = asyncio.run(
        fleet_report(
            api_client(timeout_seconds=FLEET_LIST_TIMEOUT_SECONDS),
            prometheus,
            catalog,
            args.history_seconds,
        )
    )
    ledger, problems = asyncio.run(ledger_report(prometheus)) if args.ledger else ([], [])
    currency = catalog.data.currency
    if args.format == "json":
        print(render_json(rows, currency, ledger if args.ledger else None, problems))
    else:
        print(render_table(rows))
        if args.ledger:
            print(render_ledger(ledger, problems, currency))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpusizer",
        description="Autoscale and right-size GPU inference workloads from measured telemetry.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_run(subparsers)
    _add_activator(subparsers)
    _add_simulate(subparsers)
    _add_recommend(subparsers)
    _add_crds(subparsers)
    return parser


def configure_logging(log_format: str, log_level: str) -> None:
    """kopf's handler for every line. A line about one object names it: plain text starts
    with [namespace/name] (kopf.configure's default leaves that out), JSON has an "object"."""
    import kopf

    kopf.configure(
        log_format=kopf.LogFormat[log_format.upper()],
        log_prefix=None,
        verbose=log_level == "debug",
        quiet=log_level in ("warning", "error"),
    )
    if log_level != "debug":
        logging.getLogger("kopf.objects").addFilter(_drop_routine_success_lines)


def _drop_routine_success_lines(record: logging.LogRecord) -> bool:
    """kopf logs "Timer 'partition' succeeded." for every GPUPartitioning at every period:
    lines that say nothing. Failures stay."""
    return not (record.levelno == logging.INFO and str(record.msg).endswith("succeeded."))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command not in ("run", "activator"):  # they log through kopf's handler only
        logging.basicConfig(level=getattr(args, "log_level", "info").upper())
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
