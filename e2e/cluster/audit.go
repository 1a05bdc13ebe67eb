package main

// auditPolicyYAML makes kube-apiserver log what the gpusizer operator does, and nothing else,
// to DIR/logs/audit.log: its writes to Deployments and StatefulSets and their /scale in full
// (request and response), its Events with their request, its WorkloadSizing status patches by
// name only, and its lists of what it watches (a watch that restarts lists again). A test can
// then judge every change the operator made from outside the operator (e2e/soak). The operator
// runs as the ServiceAccount deploy/rbac.yaml binds, or with the cluster's own operator
// certificate.
const auditPolicyYAML = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: RequestResponse
    users: ["system:serviceaccount:gpusizer-system:gpusizer", "gpusizer-operator"]
    verbs: [create, update, patch, delete]
    resources:
      - group: apps
        resources: [deployments, deployments/scale, statefulsets, statefulsets/scale]
  - level: Request
    users: ["system:serviceaccount:gpusizer-system:gpusizer", "gpusizer-operator"]
    verbs: [create, update, patch]
    resources:
      - group: ""
        resources: [events]
      - group: events.k8s.io
        resources: [events]
  - level: Metadata
    users: ["system:serviceaccount:gpusizer-system:gpusizer", "gpusizer-operator"]
    verbs: [create, update, patch, delete]
    resources:
      - group: gpusizer.io
        resources: [workloadsizings, workloadsizings/status]
  - level: Metadata
    users: ["system:serviceaccount:gpusizer-system:gpusizer", "gpusizer-operator"]
    verbs: [list]
    resources:
      - group: ""
        resources: [pods, nodes]
      - group: apps
        resources: [deployments, statefulsets]
      - group: gpusizer.io
        resources: [workloadsizings]
  - level: None
`
