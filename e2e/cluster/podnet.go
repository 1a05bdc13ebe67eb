package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// PodNetwork holds the pods' IPs: a /24 per node, for 512 nodes. The address range is one
// the Internet never routes (RFC 2544, network benchmarking), and cluster-up.sh routes it to
// the loopback device (`ip route add local PodNetwork dev lo`), so a process on this host
// can listen at a pod's IP and nothing sent to one leaves the host. Not 127.0.0.0/8: the
// API server refuses loopback addresses in EndpointSlices (ValidateEndpointIP in
// k8s.io/kubernetes pkg/apis/core/validation), and Services must reach these pods.
const PodNetwork = "198.18.0.0/15"

// PodNetwork is shared out in blocks of podBlockSize /24s, and each running cluster holds
// blocks of its own: two clusters on one host that handed out the same pod IPs (a soak
// beside the e2e tests) would have two GPU emulators listening at them, each answering for
// the other's pods. 64 nodes is room for every cluster but the scale benchmark's (the soak
// has 9), and 8 blocks for as many clusters at once.
const (
	podSubnets   = 512 // /24s in PodNetwork
	podBlockSize = 64
	podBlocks    = podSubnets / podBlockSize
)

// podBlockDir holds a lock file per block. Not under $TMPDIR: the route is the whole
// host's, so every cluster on the host must see the same locks.
const podBlockDir = "/tmp/gpusizer-pod-network"

// podCIDR is the k-th /24 of PodNetwork; past the 512th, one outside it, which nothing on
// this host can reach (only the scale benchmark has that many nodes).
func podCIDR(k int) string {
	if k >= podSubnets {
		return fmt.Sprintf("10.%d.%d.0/24", 100+k/256, k%256)
	}
	return fmt.Sprintf("198.%d.%d.0/24", 18+k/256, k%256)
}

// podBlocksFor is how many consecutive blocks a cluster of n nodes takes: all of them past
// 448 nodes, with its nodes past the 512th outside PodNetwork, as podCIDR says.
func podBlocksFor(n int) int {
	return min(podBlocks, max(1, (n+podBlockSize-1)/podBlockSize))
}

// claimPodBlocks takes the first run of `need` consecutive blocks that no other process
// holds, writes owner into their lock files (for the message of a cluster that finds none
// free), and returns the run's first block and the open, locked files. A block stays taken
// while its file is open, i.e. while the `cluster up` supervisor runs: the kernel drops the
// lock of a process that dies, so a crashed cluster leaves nothing to clean up.
func claimPodBlocks(dir string, need int, owner string) (int, []*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, nil, err
	}
	for first := 0; first+need <= podBlocks; first++ {
		held, err := lockBlocks(dir, first, need)
		if err != nil {
			return 0, nil, err
		}
		if held == nil {
			continue
		}
		for _, f := range held {
			if err := f.Truncate(0); err != nil {
				closeAll(held)
				return 0, nil, err
			}
			if _, err := f.WriteAt([]byte(owner+"\n"), 0); err != nil {
				closeAll(held)
				return 0, nil, err
			}
		}
		return first, held, nil
	}
	return 0, nil, fmt.Errorf("pod network %s: no %d consecutive free blocks of %d /24s for %s "+
		"(%s; the lock files are in %s): stop a cluster first",
		PodNetwork, need, podBlockSize, owner, blockHolders(dir), dir)
}

// lockBlocks locks blocks first..first+need-1, or none (nil) if another process holds one.
func lockBlocks(dir string, first, need int) ([]*os.File, error) {
	var held []*os.File
	for b := first; b < first+need; b++ {
		f, err := tryLock(filepath.Join(dir, fmt.Sprintf("block-%d", b)))
		if err != nil || f == nil {
			closeAll(held)
			return nil, err
		}
		held = append(held, f)
	}
	return held, nil
}

// tryLock opens path and locks it, or returns nil if another process holds the lock.
func tryLock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	return f, nil
}

// blockHolders says which blocks are held, and by whom.
func blockHolders(dir string) string {
	var held []string
	for b := range podBlocks {
		path := filepath.Join(dir, fmt.Sprintf("block-%d", b))
		f, err := tryLock(path)
		if f != nil {
			f.Close()
		}
		if f != nil || err != nil {
			continue
		}
		owner, _ := os.ReadFile(path)
		held = append(held, fmt.Sprintf("block %d by %s", b, strings.TrimSpace(string(owner))))
	}
	if len(held) == 0 {
		return "none held"
	}
	return "held: " + strings.Join(held, ", ")
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
