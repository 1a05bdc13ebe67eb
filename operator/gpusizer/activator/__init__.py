"""`gpusizer activator`: the request-holding proxy in front of workloads at zero.

While a workload has no ready replica, the operator points its Service at the activator
(gpusizer.activation). The activator holds each request, tells the operator at once that it
does (an annotation on the WorkloadSizing, which the operator's watch sees within
milliseconds), and forwards the requests in arrival order as soon as a replica is ready, its
responses streamed through as they come. What it holds is bounded per workload
(maxPendingRequests, holdTimeoutSeconds): past a bound a request is answered 503 or 504 with
Retry-After and a body that says why, never dropped.

A second process of the same package and image; it never imports the operator's reconcile
loop (tests/unit/test_architecture.py).
"""
