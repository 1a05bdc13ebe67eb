package main

import (
	"fmt"
	"strings"

	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodelease "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
	"sigs.k8s.io/yaml"
)

// readyElsewhereQuery is a gojq expression, evaluated by kwok's stage selector, that is
// true for a pod whose readiness kwok must not decide: a GPU pod (any container
// has a limit on an nvidia.com/* resource: the GPU emulator decides),
// or when the pod says its readiness is decided elsewhere (the e2e tests run
// the activator's processes for its pods, and mark them Ready as a kubelet's
// readiness probe would).
const readyElsewhereQuery = `([.spec.containers[]? | (.resources.limits // {}) | keys[] | select(startswith("nvidia.com/"))] | length > 0) or ` + externalQuery

// ExternalReadiness is the pod annotation by which a pod's readiness, and the end of
// its deletion, are left to whoever runs its process on this host: as a kubelet
// does, it deletes the pod object once the process has exited, so the pod stays
// Terminating (and its IP taken) while the process drains.
const ExternalReadiness = "e2e.gpusizer.io/external-readiness"

const externalQuery = `((.metadata.annotations // {})["` + ExternalReadiness + `"] == "true")`

// StagesYAML returns the kwok Stage objects used by the cluster: the ones the
// pinned kwok module exports (node-initialize, node-heartbeat-with-lease,
// pod-ready, pod-complete, pod-delete), with pod-ready restricted to pods that
// request no nvidia.com/* resource, plus pod-gpu-running, which makes GPU pods
// Running with started containers but leaves them NOT Ready: the GPU emulator
// decides when (and whether) they become Ready.
func StagesYAML() string {
	docs := []string{
		nodefast.DefaultNodeInit,
		nodelease.DefaultNodeHeartbeatWithLease,
		withGPUSelector(podfast.DefaultPodReady, "NotIn"),
		gpuRunningStage(),
		podfast.DefaultPodComplete,
		withSelector(podfast.DefaultPodDelete, externalQuery, "NotIn"),
	}
	for i := range docs {
		docs[i] = strings.TrimSpace(docs[i]) + "\n"
	}
	return strings.Join(docs, "---\n")
}

// withGPUSelector adds `readyElsewhereQuery <op> ["true"]` to the stage's selector. pod-ready
// uses NotIn, so a pod on which the query fails still becomes Ready as before.
func withGPUSelector(stage, op string) string {
	return withSelector(stage, readyElsewhereQuery, op)
}

// withSelector adds `query <op> ["true"]` to the stage's selector.
func withSelector(stage, query, op string) string {
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(stage), &obj); err != nil {
		panic(fmt.Sprintf("kwok stage does not parse: %v", err))
	}
	spec := obj["spec"].(map[string]any)
	sel := spec["selector"].(map[string]any)
	exprs, _ := sel["matchExpressions"].([]any)
	exprs = append(exprs, map[string]any{
		"key":      query,
		"operator": op,
		"values":   []any{"true"},
	})
	sel["matchExpressions"] = exprs
	out, err := yaml.Marshal(obj)
	if err != nil {
		panic(err)
	}
	return string(out)
}

func mustReplace(s, old, new string) string {
	if !strings.Contains(s, old) {
		panic(fmt.Sprintf("kwok pod-ready stage changed: %q not found", old))
	}
	return strings.ReplaceAll(s, old, new)
}

// gpuRunningStage derives pod-gpu-running from kwok's own pod-ready stage.
func gpuRunningStage() string {
	s := podfast.DefaultPodReady
	s = mustReplace(s, "name: pod-ready", "name: pod-gpu-running")
	s = mustReplace(s, `status: "True"
        type: Ready`, `status: "False"
        reason: ContainersNotReady
        type: Ready`)
	s = mustReplace(s, `status: "True"
        type: ContainersReady`, `status: "False"
        reason: ContainersNotReady
        type: ContainersReady`)
	// Regular containers: started and running, but not ready.
	s = mustReplace(s, `        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        state:
          running:`, `        name: {{ .name | Quote }}
        ready: false
        started: true
        restartCount: 0
        state:
          running:`)
	return withGPUSelector(s, "In")
}
