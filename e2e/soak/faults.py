"""The soak's faults. Each runs in a thread of its own: it breaks something for real, tells the
checker what that makes true (a window: metrics unknown to the operator, the operator unable to
act, a spec invalid), waits, repairs it, and closes the window. The schedule draws them from a
seeded generator, so a seed replays the same faults at the same times.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import requests
import urllib3
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from e2e.soak.checker import Checker, Window
from e2e.tests.conftest import Cluster, KubectlFailed, wait_until
from e2e.tests.fault_support import PrometheusProxy
from e2e.tests.operator_support import Operator, start_prometheus

INVALID_QUEUE_QUERY = "sum(rate(vllm:num_requests_waiting[1m]"  # one parenthesis short

# the longest the control plane is away under another fault (an API server restarted by
# SIGTERM holds its watches for a minute, then starts; etcd paused up to 20 s)
CONTROL_PLANE_SECONDS = 180.0
EDIT_ATTEMPTS = 5

T = TypeVar("T")


@dataclass
class Injected:
    """One fault as it happened."""

    kind: str
    start: float
    detail: str = ""
    end: float | None = None
    overlapped: bool = False  # it began while another fault was on
    facts: dict[str, Any] = field(default_factory=dict)  # what it showed (410s, relists, ...)
    names: frozenset[str] | None = None  # the workloads it touched; None: all


@dataclass
class Stage:
    """What the faults act on, shared with the harness's main loop (which holds `lock` while
    it feeds the checker)."""

    cluster: Cluster
    namespace: str
    proxy: PrometheusProxy
    operators: list[Operator]
    checker: Checker
    lock: threading.Lock
    acting: list[str]  # workloads the operator acts on (Auto, not paused, no HPA)
    deployment: Callable[[str], dict[str, Any]]  # a workload's Deployment, as first created
    active: Callable[[], Operator | None]  # the operator replica in charge now
    # GPU node -> workloads with a ready pod, in a view of the emulator's read at or after the
    # time given (None: none yet)
    pods_by_node: Callable[..., dict[str, set[str]] | None]
    apps: k8s.AppsV1Api
    core: k8s.CoreV1Api
    custom: k8s.CustomObjectsApi
    busy: set[str] = field(default_factory=set)  # resources a running fault holds
    killing: set[str] = field(default_factory=set)  # operator replicas a fault stops
    running: list[Injected] = field(default_factory=list)
    done: list[Injected] = field(default_factory=list)

    def open(self, kind: str, fault: Injected, names: Any = None) -> Window:
        with self.lock:
            return self.checker.window(kind, fault.kind, time.time(), names)

    def api_ready(self) -> bool:
        return _apiserver_ready(self)

    def close(self, *windows: Window) -> None:
        with self.lock:
            for w in windows:
                w.end = time.time()


FaultFn = Callable[[Stage, random.Random, Injected], None]


def _prometheus_killed(stage: Stage, rng: random.Random, fault: Injected) -> None:
    state = stage.cluster.state_dir
    pid = int((state / "prometheus.pid").read_text().strip())
    command = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    os.kill(pid, signal.SIGKILL)
    unknown = stage.open("unknown", fault)
    wait_until(lambda: not _alive(pid), 30, what="prometheus gone")
    time.sleep(rng.uniform(10, 40))  # the outage itself
    start_prometheus(stage.cluster, command)
    stage.close(unknown)


def _proxy(mode: str, **options: Any) -> FaultFn:
    def fault_fn(stage: Stage, rng: random.Random, fault: Injected) -> None:
        stage.proxy.set(mode, **options)
        unknown = stage.open("unknown", fault)
        time.sleep(rng.uniform(10, 40))
        stage.proxy.set("pass")
        stage.close(unknown)

    return fault_fn


def _component_pid(stage: Stage, name: str) -> int:
    for line in (stage.cluster.state_dir / "pids").read_text().splitlines():
        component, _, pid = line.partition(" ")
        if component == name:
            return int(pid)
    raise LookupError(f"no {name} in {stage.cluster.state_dir / 'pids'}")


def _apiserver_ready(stage: Stage) -> bool:
    api = stage.core.api_client
    try:
        answer = api.call_api("GET", f"{api.configuration.host}/readyz", _request_timeout=5)
        return bool(answer.status == 200)
    except Exception:
        return False


ApiReady = Callable[[], bool]  # whether the API server answers (`_apiserver_ready`)


def _through_control_plane(ready: ApiReady, edit: Callable[[], T]) -> T:
    """An edit a fault makes, made once the API server answers: faults overlap, and an edit
    sent while another fault restarted the API server or paused etcd failed and left the fault
    half done (a spec counted invalid for the rest of the run that never was)."""
    for _ in range(EDIT_ATTEMPTS - 1):
        _wait_for_api(ready)
        try:
            return edit()
        except ApiException as exc:
            if exc.status and exc.status < 500:
                raise
        except (urllib3.exceptions.HTTPError, KubectlFailed):
            pass
    _wait_for_api(ready)
    return edit()


def _wait_for_api(ready: ApiReady) -> None:
    wait_until(ready, CONTROL_PLANE_SECONDS, interval=0.5, what="API")


def _wait_while_the_api_answers(
    ready: ApiReady,
    done: Callable[[], bool],
    seconds: float,
    what: str,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> None:
    """Polls `done` until it holds, for at most `seconds` of time in which the API server
    answered: no replica can take the operator's Lease over while it is away, and a restart
    overlapping a leader's kill held the take-over past the bound (the seed-31 soak)."""
    counted, last = 0.0, clock()
    while not done():
        answering = ready()
        now = clock()
        if answering:
            counted += now - last
        last = now
        if counted > seconds:
            raise TimeoutError(
                f"timed out after {seconds:.0f}s of the API server answering, waiting for {what}"
            )
        pause(1.0)


def _apiserver_restart(stage: Stage, rng: random.Random, fault: Injected) -> None:
    """The process really restarts: its watch cache starts over from etcd, so a watch resumed
    from a resourceVersion of before meets 410 Gone. SIGKILL is a crash; SIGTERM a graceful
    restart, which holds the open watches for up to a minute while refusing new requests."""
    listed = stage.core.list_namespaced_pod(stage.namespace, limit=1)
    before = listed.metadata.resource_version
    sig = rng.choice((signal.SIGKILL, signal.SIGTERM))
    fault.detail = signal.Signals(sig).name
    pid = _component_pid(stage, "kube-apiserver")
    etcd = _etcd_url(pid)
    # the restarted server's watch cache starts at etcd's revision of then, which must be
    # past `before`: its pods were cached 0.23 s after a SIGKILL (seed 41's log), before the
    # compaction below, and with no write in between a watch from `before` resumed and met
    # no event where 410 was due (seed 39, 2026-11-27)
    _advance(etcd)
    (stage.cluster.state_dir / "restart" / "kube-apiserver").write_text("soak\n")
    fault.facts["killed"] = time.time()  # the old process takes no new request from here on
    os.kill(pid, sig)
    if sig == signal.SIGKILL:
        stage.checker.audit_may_have_lost(time.time())
    held = stage.open("held", fault)
    wait_until(lambda: not _alive(pid), 120, what="kube-apiserver exit")
    # what the API server does every 5 minutes, done while it is away: the versions the
    # watches would resume from are gone, so they meet 410 Gone (a restarted API server
    # serves a watch from etcd while its cache fills, from before the restart otherwise)
    fault.facts["compacted_to"] = _compact(etcd)
    _wait_for_api(stage.api_ready)
    stage.close(held)
    fault.facts["watch_from_before"] = _watch_from(stage, before)


def _etcd_url(apiserver_pid: int) -> str:
    """The etcd the API server talks to, from its command line."""
    for arg in Path(f"/proc/{apiserver_pid}/cmdline").read_bytes().split(b"\0"):
        if arg.startswith(b"--etcd-servers="):
            return arg.split(b"=", 1)[1].decode().split(",")[0]
    raise LookupError("kube-apiserver has no --etcd-servers")


def _advance(etcd: str) -> int:
    """Moves etcd's revision on, as the other API servers of a real cluster do while one
    restarts (with none, the revision a watch resumes from is still the newest), through
    etcd's v3 JSON gateway; returns the new revision."""
    key = base64.b64encode(b"/soak/compaction").decode()
    put = requests.post(f"{etcd}/v3/kv/put", json={"key": key, "value": key}, timeout=10)
    put.raise_for_status()
    return int(put.json()["header"]["revision"])


def _compact(etcd: str) -> int:
    """Compacts etcd's history up to a new revision, so that no watch resumes from before
    it; returns the revision."""
    revision = _advance(etcd)
    requests.post(
        f"{etcd}/v3/kv/compaction", json={"revision": revision, "physical": True}, timeout=30
    ).raise_for_status()
    return revision


def _watch_from(stage: Stage, resource_version: str) -> str:
    """What a watch resumed from `resource_version` (taken before the restart) meets."""
    watcher = k8s_watch.Watch()
    try:
        for event in watcher.stream(
            stage.core.list_namespaced_pod,
            stage.namespace,
            resource_version=resource_version,
            timeout_seconds=5,
            allow_watch_bookmarks=False,
        ):
            if event["type"] == "ERROR":
                return f"ERROR {event['raw_object'].get('code')}"
            return str(event["type"])  # it resumed: the cache still had that version
    except ApiException as exc:
        return f"HTTP {exc.status}"
    finally:
        watcher.stop()
    return "no event"


def _etcd_paused(stage: Stage, rng: random.Random, fault: Injected) -> None:
    pid = _component_pid(stage, "etcd")
    os.kill(pid, signal.SIGSTOP)
    held = stage.open("held", fault)
    try:
        time.sleep(rng.uniform(5, 20))
    finally:
        os.kill(pid, signal.SIGCONT)
    _wait_for_api(stage.api_ready)
    stage.close(held)


# kopf's peering lets a standby take over once the killed replica's record is a minute old
TAKEOVER_SECONDS = 90.0


def _leader_killed(stage: Stage, rng: random.Random, fault: Injected) -> None:
    """The replica in charge is SIGKILLed; the operator is excused until the other takes over,
    for at most TAKEOVER_SECONDS of the API server answering, after which a scale-up it owes
    counts again."""
    leader = stage.active()
    if leader is None:
        fault.detail = "no replica in charge to kill"
        return
    others = [o for o in stage.operators if o is not leader and o.running()]
    decided = {id(o): o.decisions() for o in others}
    fault.detail = leader.name
    held = stage.open("held", fault)
    stage.killing.add(leader.name)
    leader.stop(signal.SIGKILL)

    def taken_over() -> bool:
        return any(o.decisions() > decided[id(o)] for o in others if o.running())

    try:
        _wait_while_the_api_answers(
            stage.api_ready, taken_over, TAKEOVER_SECONDS, "another replica deciding"
        )
        fault.facts["takeover_s"] = round(time.time() - fault.start, 1)
    finally:
        stage.close(held)
        time.sleep(rng.uniform(5, 15))  # a kubelet's restart back-off
        # a new process, a standby behind the one now in charge. A kubelet restarts it whether
        # or not the API server answers; here a start mints its token there, and one that met
        # an overlapping restart left a single replica for the rest of the run (seed 39)
        _through_control_plane(stage.api_ready, leader.start)
        stage.killing.discard(leader.name)


def _node_scrape_down(stage: Stage, rng: random.Random, fault: Injected) -> None:
    by_node = stage.pods_by_node() or {}
    candidates = sorted(n for n, names in by_node.items() if names & set(stage.acting))
    if not candidates:
        fault.detail = "no node with a pod to hide"
        return
    node = rng.choice(candidates)
    fault.detail = node
    fault.names = frozenset(by_node[node])
    url = f"{stage.cluster.gpusim_url}/v1/nodes/{node}/scrape"
    requests.put(url, json={"up": False}, timeout=10).raise_for_status()
    down = time.time()
    unknown = stage.open("unknown", fault, fault.names)
    try:
        # the view above is the emulator's last tick: a pod deleted since (seed 36's w171,
        # scaled down half a second before) still showed on the node. Hidden are those still
        # there in a view read after, narrowed within the 10 s the judge allows a decision.
        after = wait_until(lambda: stage.pods_by_node(down), 8, what="the emulator's next view")
        with stage.lock:
            unknown.names = fault.names = fault.names & after.get(node, set())
        time.sleep(rng.uniform(10, 40))
    finally:
        requests.put(url, json={"up": True}, timeout=10).raise_for_status()
        stage.close(unknown)


def _target_recreated(stage: Stage, rng: random.Random, fault: Injected) -> None:
    name = rng.choice(stage.acting)
    fault.detail, fault.names = name, frozenset({name})
    held = stage.open("held", fault, {name})
    try:
        _through_control_plane(
            stage.api_ready,
            lambda: stage.apps.delete_namespaced_deployment(name, stage.namespace),
        )
    except Exception:
        stage.close(held)  # nothing was deleted
        raise
    time.sleep(rng.uniform(5, 20))

    def recreate() -> None:
        with stage.lock:
            stage.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(stage.deployment(name)))
            stage.checker.set_replicas(name, 1)

    _through_control_plane(stage.api_ready, recreate)
    stage.close(held)


def _invalid_spec(stage: Stage, rng: random.Random, fault: Injected) -> None:
    """An edit the API server accepts and the operator refuses (PromQL it cannot parse)."""
    name = rng.choice(stage.acting)
    fault.detail, fault.names = name, frozenset({name})

    def queue_query(query: str | None) -> None:
        body = {"spec": {"metrics": {"queueQuery": query}}}
        _through_control_plane(
            stage.api_ready,
            lambda: stage.custom.patch_namespaced_custom_object(
                "gpusizer.io", "v1alpha1", stage.namespace, "workloadsizings", name, body
            ),
        )

    invalid = stage.open("invalid", fault, {name})
    try:
        queue_query(INVALID_QUEUE_QUERY)
    except Exception:
        stage.close(invalid)  # the spec never became invalid
        raise
    time.sleep(rng.uniform(10, 30))
    queue_query(None)  # if this fails the spec stays invalid, and the window open
    stage.close(invalid)


def _conflict_burst(stage: Stage, rng: random.Random, fault: Injected) -> None:
    """Another writer changes five targets (an annotation) as fast as it can: the operator's
    writes, which carry the resourceVersion they read, meet 409s."""
    names = rng.sample(stage.acting, 5)
    fault.detail, fault.names = ",".join(names), frozenset(names)
    held = stage.open("held", fault, names)
    stop = threading.Event()
    patched = [0]

    def hammer(worker: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            body = {"metadata": {"annotations": {f"soak-hammer-{worker}": str(i)}}}
            try:
                stage.apps.patch_namespaced_deployment(names[i % 5], stage.namespace, body)
                patched[0] += 1
            except Exception:
                continue

    threads = [threading.Thread(target=hammer, args=(w,), daemon=True) for w in range(3)]
    for t in threads:
        t.start()
    time.sleep(rng.uniform(10, 30))
    stop.set()
    for t in threads:
        t.join(timeout=30)
    fault.facts["patches"] = patched[0]
    stage.close(held)


FAULTS: dict[str, tuple[str, FaultFn]] = {  # kind -> (the resource it holds, what it does)
    "prometheus-killed": ("prometheus", _prometheus_killed),
    "prometheus-slow": ("proxy", _proxy("slow", delay=5.0)),
    "prometheus-500": ("proxy", _proxy("status", status_code=500)),
    "prometheus-garbage": ("proxy", _proxy("garbage")),
    "apiserver-restart": ("control-plane", _apiserver_restart),
    "etcd-paused": ("control-plane", _etcd_paused),
    "leader-killed": ("operators", _leader_killed),
    "node-scrape-down": ("scrape", _node_scrape_down),
    "target-recreated": ("targets", _target_recreated),
    "invalid-spec": ("specs", _invalid_spec),
    "conflict-burst": ("conflicts", _conflict_burst),
}


KINDS = tuple(FAULTS)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class Schedule:
    """A fault every `every` seconds, drawn from a bag of every kind shuffled anew each round,
    so that every kind comes once in each round of len(KINDS) faults; a kind whose resource
    a running fault holds waits for a later turn (overlaps of different kinds happen all the
    time: most faults last longer than the period)."""

    def __init__(self, stage: Stage, rng: random.Random, every: float) -> None:
        self.stage = stage
        self.rng = rng
        self.every = every
        self.bag: list[str] = []
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def next_kind(self) -> str | None:
        if not self.bag:
            self.bag = list(KINDS)
            self.rng.shuffle(self.bag)
        for kind in self.bag:
            if FAULTS[kind][0] not in self.stage.busy:
                self.bag.remove(kind)
                return kind
        return None

    def inject(self) -> Injected | None:
        kind = self.next_kind()
        if kind is None:
            return None
        resource, run = FAULTS[kind]
        fault = Injected(kind, time.time(), overlapped=bool(self.stage.running))
        # each fault draws from a generator of its own, seeded from the schedule's: the timing
        # of one fault's threads never shifts what the next one draws
        rng = random.Random(self.rng.getrandbits(64))
        self.stage.busy.add(resource)
        self.stage.running.append(fault)

        def run_it() -> None:
            try:
                run(self.stage, rng, fault)
            except Exception as exc:  # a fault that could not be injected is reported, not fatal
                self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            finally:
                fault.end = time.time()
                self.stage.running.remove(fault)
                self.stage.done.append(fault)
                self.stage.busy.discard(resource)

        thread = threading.Thread(target=run_it, name=f"fault-{kind}", daemon=True)
        thread.start()
        self.threads.append(thread)
        return fault

    def drain(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))


def kill_leftovers(stage: Stage) -> None:
    """Whatever a fault left broken when the soak ends early: etcd resumed, the proxy passing,
    every node's exporter up."""
    with contextlib.suppress(OSError, LookupError):
        os.kill(_component_pid(stage, "etcd"), signal.SIGCONT)
    stage.proxy.set("pass")
    for node in stage.pods_by_node() or {}:
        requests.put(
            f"{stage.cluster.gpusim_url}/v1/nodes/{node}/scrape", json={"up": True}, timeout=10
        )


def describe(fault: Injected) -> dict[str, Any]:
    return {
        "kind": fault.kind,
        "start": round(fault.start, 1),
        "seconds": round((fault.end or fault.start) - fault.start, 1),
        "detail": fault.detail,
        "overlapped": fault.overlapped,
        **({"facts": json.loads(json.dumps(fault.facts))} if fault.facts else {}),
    }
