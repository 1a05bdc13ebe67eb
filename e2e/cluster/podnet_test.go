package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPodCIDR(t *testing.T) {
	for k, want := range map[int]string{
		0:   "198.18.0.0/24",
		255: "198.18.255.0/24",
		256: "198.19.0.0/24",
		511: "198.19.255.0/24",
		512: "10.102.0.0/24",
		700: "10.102.188.0/24",
	} {
		if got := podCIDR(k); got != want {
			t.Errorf("podCIDR(%d) = %s, want %s", k, got, want)
		}
	}
}

func TestPodBlocksFor(t *testing.T) {
	for n, want := range map[int]int{0: 1, 9: 1, 64: 1, 65: 2, 80: 2, 448: 7, 449: 8, 512: 8, 5000: 8} {
		if got := podBlocksFor(n); got != want {
			t.Errorf("podBlocksFor(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestNodesTakeTheirBlock(t *testing.T) {
	np := &NodePools{Pools: []Pool{{Name: "a", Count: 2}, {Name: "b", Count: 1}}}
	var got []string
	for _, n := range np.nodes(3) {
		got = append(got, n.Spec.PodCIDR)
	}
	if want := "198.18.192.0/24 198.18.193.0/24 198.18.194.0/24"; strings.Join(got, " ") != want {
		t.Errorf("pod CIDRs of block 3: %v, want %s", got, want)
	}
}

// claimPodBlocks relies on flock(2) locks of separate opens conflicting, within one
// process too, as they do between the supervisors of two clusters.
func TestClaimPodBlocks(t *testing.T) {
	dir := t.TempDir()
	claim := func(need int, owner string) (int, []*os.File) {
		t.Helper()
		first, held, err := claimPodBlocks(dir, need, owner)
		if err != nil {
			t.Fatalf("claim %d for %s: %v", need, owner, err)
		}
		if len(held) != need {
			t.Fatalf("claim %d for %s: holds %d", need, owner, len(held))
		}
		return first, held
	}
	a, heldA := claim(1, "/a")
	b, heldB := claim(2, "/b")
	c, heldC := claim(1, "/c")
	if a != 0 || b != 1 || c != 3 {
		t.Fatalf("first blocks %d, %d, %d; want 0, 1, 3", a, b, c)
	}
	if owner, _ := os.ReadFile(filepath.Join(dir, "block-2")); string(owner) != "/b\n" {
		t.Errorf("block-2 says %q, want the owner /b", owner)
	}

	_, _, err := claimPodBlocks(dir, podBlocks, "/scale")
	if err == nil || !strings.Contains(err.Error(), "block 1 by /b") {
		t.Fatalf("claiming every block beside three clusters: %v, want an error naming /b", err)
	}

	// A cluster that stops (or dies: the kernel closes its files) frees its blocks.
	closeAll(heldB)
	if d, heldD := claim(2, "/d"); d != 1 {
		t.Errorf("after /b stopped, a 2-block cluster got block %d, want 1", d)
	} else {
		closeAll(heldD)
	}
	closeAll(heldA)
	closeAll(heldC)
	if all, heldAll := claim(podBlocks, "/scale"); all != 0 {
		t.Errorf("alone, the scale benchmark got block %d, want 0", all)
	} else {
		closeAll(heldAll)
	}
}
