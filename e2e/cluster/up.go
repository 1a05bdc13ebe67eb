package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/component-base/version"
)

const (
	serviceCIDR = "10.96.0.0/16"
	serviceIP   = "10.96.0.1"
	saIssuer    = "https://kubernetes.default.svc.cluster.local"
)

func gitVersion() string { return version.Get().GitVersion }

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s up: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// child is one component process.
type child struct {
	name string
	args []string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

type supervisor struct {
	self     string
	stateDir string
	mu       sync.Mutex
	children []*child
	died     chan *child
}

func (s *supervisor) start(name string, args ...string) (*child, error) {
	logPath := filepath.Join(s.stateDir, "logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(s.self, append([]string{name}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = s.stateDir
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(s.stateDir, "home"))
	// Own process group (so the group can be signalled as a whole), and die
	// with the supervisor even if it is SIGKILLed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, args: args, cmd: cmd, done: make(chan struct{})}
	s.mu.Lock()
	replaced := false
	for i, old := range s.children {
		if old.name == name {
			s.children[i], replaced = c, true
		}
	}
	if !replaced {
		s.children = append(s.children, c)
	}
	s.mu.Unlock()
	go func() {
		c.err = cmd.Wait()
		f.Close()
		close(c.done)
		select {
		case s.died <- c:
		default:
		}
	}()
	logf("started %s (pid %d), log %s", name, cmd.Process.Pid, logPath)
	return c, nil
}

// restartRequested says whether a test asked for this component to be started again when it
// exits (by writing DIR/restart/<name> before stopping it), and consumes the request.
func (s *supervisor) restartRequested(c *child) bool {
	err := os.Remove(filepath.Join(s.stateDir, "restart", c.name))
	return err == nil
}

// stopAll stops the children in reverse start order: SIGTERM to the process
// group, then SIGKILL after a grace period.
func (s *supervisor) stopAll(grace time.Duration) {
	s.mu.Lock()
	children := append([]*child(nil), s.children...)
	s.mu.Unlock()
	for i := len(children) - 1; i >= 0; i-- {
		c := children[i]
		select {
		case <-c.done:
			continue
		default:
		}
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(grace):
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.done
		}
		logf("stopped %s", c.name)
	}
}

func (s *supervisor) writePids() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "up %d\n", os.Getpid())
	for _, c := range s.children {
		fmt.Fprintf(&b, "%s %d\n", c.name, c.cmd.Process.Pid)
	}
	return os.WriteFile(filepath.Join(s.stateDir, "pids"), []byte(b.String()), 0o644)
}

// waitFor polls check until it succeeds, a child dies, or the deadline passes.
func (s *supervisor) waitFor(ctx context.Context, what string, c *child, check func() error) error {
	start := time.Now()
	var last error
	for {
		if last = check(); last == nil {
			logf("%s ready after %s", what, time.Since(start).Round(time.Millisecond))
			return nil
		}
		if c != nil {
			select {
			case <-c.done:
				return fmt.Errorf("%s exited (%v) before it was ready; see %s", c.name, c.err,
					filepath.Join(s.stateDir, "logs", c.name+".log"))
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last error: %v)", what, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func httpCheck(client *http.Client, url string, want string) func() error {
	return func() error {
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(body)))
		}
		if want != "" && !strings.Contains(string(body), want) {
			return fmt.Errorf("%s: %s", url, strings.TrimSpace(string(body)))
		}
		return nil
	}
}

func writeKubeconfig(path, server string, ca *certPair, user *certPair, userName string) error {
	caPEM, err := os.ReadFile(ca.CertFile)
	if err != nil {
		return err
	}
	certPEM, err := os.ReadFile(user.CertFile)
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(user.KeyFile)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["gpusizer-local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[userName] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts["gpusizer-local"] = &clientcmdapi.Context{Cluster: "gpusizer-local", AuthInfo: userName, Namespace: "default"}
	cfg.CurrentContext = "gpusizer-local"
	return clientcmd.WriteToFile(*cfg, path)
}

func runUp(args []string) int {
	// Pdeathsig is delivered when the OS thread that started a child exits, not the
	// process: start every child from the main goroutine, locked to the main thread.
	runtime.LockOSThread()
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	stateDir := fs.String("state-dir", ".cluster", "directory for certificates, data, logs, kubeconfig and pids")
	nodePools := fs.String("nodepools", "", "node pools YAML (see e2e/cluster/nodepools.yaml); empty: no GPU nodes")
	timeout := fs.Duration("timeout", 3*time.Minute, "how long to wait for the cluster to become ready")
	clientQPS := fs.Int("client-qps", 0, "API request rate of kube-controller-manager and kube-scheduler (0: their defaults, 20 and 50 per second); raised to create thousands of workloads quickly")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := up(*stateDir, *nodePools, *timeout, *clientQPS); err != nil {
		logf("error: %v", err)
		return 1
	}
	return 0
}

func up(stateDir, nodePoolsPath string, timeout time.Duration, clientQPS int) (retErr error) {
	start := time.Now()
	var err error
	if stateDir, err = filepath.Abs(stateDir); err != nil {
		return err
	}
	var pools *NodePools
	if nodePoolsPath != "" {
		if pools, err = loadNodePools(nodePoolsPath); err != nil {
			return err
		}
	}
	nodeCount := 0
	if pools != nil {
		nodeCount = pools.nodeCount()
	}
	firstBlock, blocks, err := claimPodBlocks(podBlockDir, podBlocksFor(nodeCount), stateDir)
	if err != nil {
		return err
	}
	defer closeAll(blocks) // held until the supervisor returns
	logf("pod IPs: %s to %s, %d block(s) of %s from block %d", podCIDR(firstBlock*podBlockSize),
		podCIDR((firstBlock+len(blocks))*podBlockSize-1), len(blocks), PodNetwork, firstBlock)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	for _, d := range []string{"logs", "home", "etcd", "restart"} {
		if err := os.MkdirAll(filepath.Join(stateDir, d), 0o755); err != nil {
			return err
		}
	}
	_ = os.Remove(filepath.Join(stateDir, "ready"))
	if err := os.WriteFile(filepath.Join(stateDir, "up.pid"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	pkiDir := filepath.Join(stateDir, "pki")
	p, err := newPKI(pkiDir)
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}

	ports := map[string]int{}
	for _, n := range []string{"etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok"} {
		if ports[n], err = freePort(); err != nil {
			return err
		}
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", ports["apiserver"])
	kubeconfigs := map[string]string{}
	for name, pair := range map[string]*certPair{
		"admin": p.Admin, "controller-manager": p.ControllerMgr, "scheduler": p.Scheduler,
		"kwok": p.Kwok, "operator": p.Operator,
	} {
		path := filepath.Join(pkiDir, name+".kubeconfig")
		if err := writeKubeconfig(path, server, p.CA, pair, pair.cert.Subject.CommonName); err != nil {
			return err
		}
		kubeconfigs[name] = path
	}

	s := &supervisor{self: self, stateDir: stateDir, died: make(chan *child, 16)}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		sig, ok := <-sigs
		if ok {
			logf("got %v while starting: stopping", sig)
			cancel()
		}
	}()
	defer func() {
		if retErr != nil {
			s.stopAll(10 * time.Second)
		}
	}()

	// etcd
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", ports["etcd"])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports["etcd-peer"])
	etcd, err := s.start("etcd",
		"--name=gpusizer",
		"--data-dir="+filepath.Join(stateDir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=gpusizer="+peerURL,
		"--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=4294967296")
	if err != nil {
		return err
	}
	plain := &http.Client{Timeout: 2 * time.Second}
	if err := s.waitFor(ctx, "etcd", etcd, httpCheck(plain, etcdURL+"/health", `"health":"true"`)); err != nil {
		return err
	}

	// kube-apiserver, with an audit log of the operator's writes
	auditPolicy := filepath.Join(stateDir, "audit-policy.yaml")
	if err := os.WriteFile(auditPolicy, []byte(auditPolicyYAML), 0o644); err != nil {
		return err
	}
	apiserver, err := s.start("kube-apiserver",
		"--audit-policy-file="+auditPolicy,
		"--audit-log-path="+filepath.Join(stateDir, "logs", "audit.log"),
		"--audit-log-format=json", "--audit-log-maxsize=0",
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports["apiserver"]),
		"--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
		"--cert-dir="+pkiDir,
		"--tls-cert-file="+p.APIServer.CertFile, "--tls-private-key-file="+p.APIServer.KeyFile,
		"--client-ca-file="+p.CA.CertFile,
		"--service-account-issuer="+saIssuer,
		"--service-account-key-file="+p.SAPub,
		"--service-account-signing-key-file="+p.SAKey,
		"--service-cluster-ip-range="+serviceCIDR,
		"--authorization-mode=Node,RBAC",
		"--requestheader-client-ca-file="+p.FrontProxyCA.CertFile,
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file="+p.FrontProxy.CertFile,
		"--proxy-client-key-file="+p.FrontProxy.KeyFile,
		"--enable-aggregator-routing=true",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1")
	if err != nil {
		return err
	}
	caPool := x509.NewCertPool()
	caPool.AddCert(p.CA.cert)
	adminTLS, err := tls.LoadX509KeyPair(p.Admin.CertFile, p.Admin.KeyFile)
	if err != nil {
		return err
	}
	admin := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: caPool, Certificates: []tls.Certificate{adminTLS}}}}
	if err := s.waitFor(ctx, "kube-apiserver", apiserver, httpCheck(admin, server+"/readyz", "")); err != nil {
		return err
	}

	// kube-controller-manager, kube-scheduler, kwok
	var rateFlags []string
	if clientQPS > 0 {
		rateFlags = []string{"--kube-api-qps=" + strconv.Itoa(clientQPS), "--kube-api-burst=" + strconv.Itoa(2*clientQPS)}
	}
	kcm, err := s.start("kube-controller-manager", append(rateFlags,
		"--kubeconfig="+kubeconfigs["controller-manager"],
		"--authentication-kubeconfig="+kubeconfigs["controller-manager"],
		"--authorization-kubeconfig="+kubeconfigs["controller-manager"],
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports["controller-manager"]),
		"--leader-elect=false",
		"--controllers=*",
		"--root-ca-file="+p.CA.CertFile,
		"--service-account-private-key-file="+p.SAKey,
		"--use-service-account-credentials=true",
		"--cluster-signing-cert-file="+p.CA.CertFile,
		"--cluster-signing-key-file="+p.CA.KeyFile,
		"--service-cluster-ip-range="+serviceCIDR,
		"--allocate-node-cidrs=false",
		"--profiling=false",
		"--v=1")...)
	if err != nil {
		return err
	}
	sched, err := s.start("kube-scheduler", append(rateFlags,
		"--kubeconfig="+kubeconfigs["scheduler"],
		"--authentication-kubeconfig="+kubeconfigs["scheduler"],
		"--authorization-kubeconfig="+kubeconfigs["scheduler"],
		"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports["scheduler"]),
		"--leader-elect=false",
		"--profiling=false",
		"--v=1")...)
	if err != nil {
		return err
	}
	kwokConfig := filepath.Join(stateDir, "kwok.yaml")
	if err := os.WriteFile(kwokConfig, []byte(StagesYAML()), 0o644); err != nil {
		return err
	}
	kwok, err := s.start("kwok",
		"--kubeconfig="+kubeconfigs["kwok"],
		"--config="+kwokConfig,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--node-lease-duration-seconds=40",
		"--cidr=10.244.0.1/16",
		"--node-ip=10.10.0.1",
		"--server-address="+fmt.Sprintf("127.0.0.1:%d", ports["kwok"]))
	if err != nil {
		return err
	}
	insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // loopback self-signed health endpoints
	if err := s.waitFor(ctx, "kube-controller-manager", kcm,
		httpCheck(insecure, fmt.Sprintf("https://127.0.0.1:%d/healthz", ports["controller-manager"]), "ok")); err != nil {
		return err
	}
	if err := s.waitFor(ctx, "kube-scheduler", sched,
		httpCheck(insecure, fmt.Sprintf("https://127.0.0.1:%d/healthz", ports["scheduler"]), "ok")); err != nil {
		return err
	}
	if err := s.waitFor(ctx, "kwok", kwok,
		httpCheck(plain, fmt.Sprintf("http://127.0.0.1:%d/healthz", ports["kwok"]), "")); err != nil {
		return err
	}

	// Objects: GPU nodes, then wait for the default ServiceAccount and Ready nodes.
	restCfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigs["admin"])
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	var nodeNames []string
	if pools != nil {
		nodes := pools.nodes(firstBlock)
		if err := applyNodes(ctx, cs, nodes); err != nil {
			return err
		}
		for _, n := range nodes {
			nodeNames = append(nodeNames, n.Name)
		}
		logf("created %d GPU nodes from %s", len(nodes), nodePoolsPath)
	}
	if err := s.waitFor(ctx, "default ServiceAccount", kcm, func() error {
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, err = cs.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	}); err != nil {
		return err
	}
	if err := s.waitFor(ctx, "nodes Ready", kwok, func() error {
		for _, name := range nodeNames {
			n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			ready := false
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready = true
				}
			}
			if !ready {
				return fmt.Errorf("node %s not Ready", name)
			}
		}
		return nil
	}); err != nil {
		return err
	}

	kubeconfig := filepath.Join(stateDir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, server, p.CA, p.Admin, "kubernetes-admin"); err != nil {
		return err
	}
	if err := s.writePids(); err != nil {
		return err
	}
	sv, err := cs.Discovery().ServerVersion()
	if err != nil {
		return err
	}
	ready := fmt.Sprintf("KUBECONFIG=%s\nAPISERVER=%s\nVERSION=%s\nNODES=%d\nOPERATOR_KUBECONFIG=%s\nPOD_BLOCK=%d\n",
		kubeconfig, server, sv.GitVersion, len(nodeNames), kubeconfigs["operator"], firstBlock)
	if err := os.WriteFile(filepath.Join(stateDir, "ready"), []byte(ready), 0o644); err != nil {
		return err
	}
	fmt.Printf("cluster ready in %s: Kubernetes %s at %s, %d GPU nodes\nexport KUBECONFIG=%s\n",
		time.Since(start).Round(100*time.Millisecond), sv.GitVersion, server, len(nodeNames), kubeconfig)

	// Supervise: stay in the foreground until a signal arrives or a child dies.
	signal.Stop(sigs)
	close(sigs)
	term := make(chan os.Signal, 2)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	var exitErr error
supervise:
	for {
		select {
		case sig := <-term:
			logf("got %v: stopping the cluster", sig)
			break supervise
		case c := <-s.died:
			if s.restartRequested(c) {
				logf("%s exited (%v) as requested: starting it again", c.name, c.err)
				if _, err := s.start(c.name, c.args...); err != nil {
					exitErr = err
				} else if err := s.writePids(); err != nil {
					exitErr = err
				}
				if exitErr == nil {
					continue
				}
			} else {
				exitErr = fmt.Errorf("%s exited unexpectedly (%v): stopping the cluster; see %s", c.name, c.err,
					filepath.Join(stateDir, "logs", c.name+".log"))
			}
			logf("%v", exitErr)
			break supervise
		}
	}
	_ = os.Remove(filepath.Join(stateDir, "ready"))
	s.stopAll(10 * time.Second)
	_ = os.Remove(filepath.Join(stateDir, "pids"))
	if exitErr != nil {
		return errors.New("a component died")
	}
	return nil
}
