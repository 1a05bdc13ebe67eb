package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"
)

// NodePools is the file format of nodepools.yaml. Every GPU-specific fact
// (MIG layout, resource names and counts) is spelled out in the file: this
// code only maps fields to labels and turns the lists into Node objects.
type NodePools struct {
	Pools []Pool `json:"pools"`
}

// Pool is a group of identical fake GPU nodes.
type Pool struct {
	Name         string `json:"name"`
	Count        int    `json:"count"`
	Product      string `json:"product"`      // nvidia.com/gpu.product
	Family       string `json:"family"`       // nvidia.com/gpu.family
	GPUCount     int    `json:"gpuCount"`     // nvidia.com/gpu.count (physical GPUs)
	GPUMemoryMiB int    `json:"gpuMemoryMiB"` // nvidia.com/gpu.memory
	MIGCapable   bool   `json:"migCapable"`   // nvidia.com/mig.capable
	MIGStrategy  string `json:"migStrategy"`  // nvidia.com/mig.strategy: none | single | mixed
	MIGConfig    string `json:"migConfig"`    // nvidia.com/mig.config (state "success"); empty: no label
	// Labels are added as they are (e.g. nvidia.com/mig-3g.40gb.count).
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Taints      []corev1.Taint    `json:"taints,omitempty"`
	// Allocatable lists every resource of one node, GPU resources included
	// (cpu, memory, pods, nvidia.com/gpu, nvidia.com/mig-...). Capacity = allocatable.
	Allocatable map[string]string `json:"allocatable"`
}

func loadNodePools(path string) (*NodePools, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var np NodePools
	if err := yaml.UnmarshalStrict(data, &np); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	seen := map[string]bool{}
	for _, p := range np.Pools {
		if p.Name == "" || p.Count < 0 {
			return nil, fmt.Errorf("%s: pool needs a name and a count >= 0", path)
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("%s: pool %q listed twice", path, p.Name)
		}
		seen[p.Name] = true
		for k, v := range p.Allocatable {
			if _, err := resource.ParseQuantity(v); err != nil {
				return nil, fmt.Errorf("%s: pool %s: allocatable %s=%q: %w", path, p.Name, k, v, err)
			}
		}
	}
	return &np, nil
}

// nodeCount is the number of nodes of every pool.
func (np *NodePools) nodeCount() int {
	n := 0
	for _, p := range np.Pools {
		n += p.Count
	}
	return n
}

// nodes returns the Node objects of every pool, named <pool>-<index>, with the pod CIDRs of
// PodNetwork's block firstBlock on (see claimPodBlocks).
func (np *NodePools) nodes(firstBlock int) []*corev1.Node {
	var out []*corev1.Node
	for pi, p := range np.Pools {
		for i := 0; i < p.Count; i++ {
			name := fmt.Sprintf("%s-%d", p.Name, i)
			labels := map[string]string{
				"kubernetes.io/hostname":          name,
				"kubernetes.io/os":                "linux",
				"kubernetes.io/arch":              "amd64",
				"type":                            "kwok",
				"gpusizer.io/node-pool":           p.Name,
				"nvidia.com/gpu.present":          "true",
				"nvidia.com/gpu.product":          p.Product,
				"nvidia.com/gpu.family":           p.Family,
				"nvidia.com/gpu.count":            strconv.Itoa(p.GPUCount),
				"nvidia.com/gpu.memory":           strconv.Itoa(p.GPUMemoryMiB),
				"nvidia.com/mig.capable":          strconv.FormatBool(p.MIGCapable),
				"nvidia.com/gpu.replicas":         "1",
				"nvidia.com/gpu.sharing-strategy": "none",
			}
			if p.MIGStrategy != "" {
				labels["nvidia.com/mig.strategy"] = p.MIGStrategy
			}
			if p.MIGConfig != "" {
				labels["nvidia.com/mig.config"] = p.MIGConfig
				labels["nvidia.com/mig.config.state"] = "success"
			}
			for k, v := range p.Labels {
				labels[k] = v
			}
			annotations := map[string]string{
				"kwok.x-k8s.io/node":           "fake",
				"node.alpha.kubernetes.io/ttl": "0",
			}
			for k, v := range p.Annotations {
				annotations[k] = v
			}
			res := corev1.ResourceList{}
			keys := make([]string, 0, len(p.Allocatable))
			for k := range p.Allocatable {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				res[corev1.ResourceName(k)] = resource.MustParse(p.Allocatable[k])
			}
			ip := fmt.Sprintf("10.10.%d.%d", pi+1, i+1)
			cidr := podCIDR(firstBlock*podBlockSize + len(out))
			out = append(out, &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
				Spec: corev1.NodeSpec{
					ProviderID: "kwok://" + name,
					PodCIDR:    cidr,
					PodCIDRs:   []string{cidr},
					Taints:     p.Taints,
				},
				Status: corev1.NodeStatus{
					Capacity:    res.DeepCopy(),
					Allocatable: res.DeepCopy(),
					Addresses: []corev1.NodeAddress{
						{Type: corev1.NodeInternalIP, Address: ip},
						{Type: corev1.NodeHostName, Address: name},
					},
					NodeInfo: corev1.NodeSystemInfo{
						Architecture:            "amd64",
						OperatingSystem:         "linux",
						KubeletVersion:          "fake",
						KubeProxyVersion:        "fake",
						ContainerRuntimeVersion: "kwok",
						OSImage:                 "kwok GPU node (" + p.Product + ")",
					},
					Phase: corev1.NodeRunning,
				},
			})
		}
	}
	return out
}

// applyNodes creates the nodes (or updates the labels and status of existing ones).
func applyNodes(ctx context.Context, cs kubernetes.Interface, nodes []*corev1.Node) error {
	for _, n := range nodes {
		created, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			created, err = cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err == nil {
				created.Labels, created.Annotations = n.Labels, n.Annotations
				created.Spec.Taints = n.Spec.Taints
				created, err = cs.CoreV1().Nodes().Update(ctx, created, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		// Make sure capacity/allocatable are what the pool says, whatever the
		// create strategy kept of the status (kwok may write status concurrently).
		want := n
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := cs.CoreV1().Nodes().Get(ctx, want.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if equality.Semantic.DeepEqual(cur.Status.Allocatable, want.Status.Allocatable) &&
				equality.Semantic.DeepEqual(cur.Status.Capacity, want.Status.Capacity) {
				return nil
			}
			cur.Status.Capacity = want.Status.Capacity
			cur.Status.Allocatable = want.Status.Allocatable
			cur.Status.Addresses = want.Status.Addresses
			cur.Status.NodeInfo = want.Status.NodeInfo
			_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("node %s status: %w", n.Name, err)
		}
		_ = created
	}
	return nil
}

// runApplyNodes is `cluster apply-nodes --kubeconfig K --nodepools F [--pod-block B]`:
// creates the fake GPU nodes of F in any cluster whose kwok manages nodes annotated
// kwok.x-k8s.io/node=fake (e.g. a kind cluster with kwok installed).
func runApplyNodes(args []string) int {
	fs := flag.NewFlagSet("apply-nodes", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the target cluster")
	poolsPath := fs.String("nodepools", "e2e/cluster/nodepools.yaml", "node pools YAML")
	podBlock := fs.Int("pod-block", 0, "the cluster's first block of "+PodNetwork+
		" (POD_BLOCK of its env file), whence the nodes' pod CIDRs")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *podBlock < 0 || *podBlock >= podBlocks {
		fmt.Fprintf(os.Stderr, "--pod-block: %d is not within 0..%d\n", *podBlock, podBlocks-1)
		return 2
	}
	pools, err := loadNodePools(*poolsPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	nodes := pools.nodes(*podBlock)
	if err := applyNodes(context.Background(), cs, nodes); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for _, n := range nodes {
		fmt.Printf("node/%s applied\n", n.Name)
	}
	return 0
}
