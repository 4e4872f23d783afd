// Package k8s holds baton's Kubernetes manifests (a kustomize base and
// overlays) and the tests that build them the way kubectl apply -k does and
// check them against what baton actually serves.
package k8s

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/batonlm/baton/test/harness"
)

// builds are the kustomizations a user may apply.
var builds = []string{"base", "overlays/cpu", "overlays/gpu-rdma"}

// manifests is one kustomize build, strictly decoded.
type manifests struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	pdbs        []*policyv1.PodDisruptionBudget
	pvcs        []*corev1.PersistentVolumeClaim
}

// build runs kustomize in-process on dir of fs, as kubectl apply -k would,
// and decodes every object into its Kubernetes type, refusing unknown
// fields: a misspelt or misplaced field would be dropped by the API
// server's decoder as silently as by a lenient one here.
func build(fs filesys.FileSystem, dir string) (*manifests, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(fs, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	m := &manifests{}
	for _, r := range rm.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			return nil, err
		}
		id := r.GetKind() + "/" + r.GetName()
		var into any
		var want string
		switch r.GetKind() {
		case "Deployment":
			d := &appsv1.Deployment{}
			m.deployments, into, want = append(m.deployments, d), d, "apps/v1"
		case "Service":
			s := &corev1.Service{}
			m.services, into, want = append(m.services, s), s, "v1"
		case "PodDisruptionBudget":
			p := &policyv1.PodDisruptionBudget{}
			m.pdbs, into, want = append(m.pdbs, p), p, "policy/v1"
		case "PersistentVolumeClaim":
			p := &corev1.PersistentVolumeClaim{}
			m.pvcs, into, want = append(m.pvcs, p), p, "v1"
		default:
			return nil, fmt.Errorf("%s: a kind this test does not know; teach it what to check", id)
		}
		if err := yaml.UnmarshalStrict(y, into); err != nil {
			return nil, fmt.Errorf("%s: %w", id, err)
		}
		if got := r.GetApiVersion(); got != want {
			return nil, fmt.Errorf("%s: apiVersion %s, want %s", id, got, want)
		}
	}
	return m, nil
}

// flags reads a container's args. The manifests write every flag as
// --name=value so that a reader, a patch and this parser agree on which
// value belongs to which flag; a repeated flag's values are kept in order
// (pflag takes the last for a scalar).
func flags(args []string) (map[string][]string, error) {
	if len(args) == 0 || args[0] != "serve" {
		return nil, fmt.Errorf("args %q do not start with serve", args)
	}
	out := map[string][]string{}
	for _, a := range args[1:] {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			return nil, fmt.Errorf("arg %q is not of the form --flag=value", a)
		}
		out[name] = append(out[name], value)
	}
	return out, nil
}

func last(f map[string][]string, name, def string) string {
	if v := f[name]; len(v) > 0 {
		return v[len(v)-1]
	}
	return def
}

// podIP stands in for status.podIP when args are expanded for a dry run,
// which binds and dials nothing.
const podIP = "127.0.0.1"

// varRef is Kubernetes' $(VAR) reference in args.
var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand substitutes $(VAR) in args as the kubelet does. A reference to a
// variable the container does not define would reach baton as the literal
// text, so it is an error here.
func expand(c *corev1.Container) ([]string, error) {
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			env[e.Name] = podIP
		default:
			env[e.Name] = "value-of-" + e.Name
		}
	}
	var errs []error
	out := make([]string, len(c.Args))
	for i, a := range c.Args {
		out[i] = varRef.ReplaceAllStringFunc(a, func(ref string) string {
			name := varRef.FindStringSubmatch(ref)[1]
			v, ok := env[name]
			if !ok {
				errs = append(errs, fmt.Errorf("arg %q refers to $(%s), which the container's env does not define", a, name))
			}
			return v
		})
	}
	return out, errors.Join(errs...)
}

// batonContainer is the one container of a Deployment that runs baton.
func batonContainer(d *appsv1.Deployment) (*corev1.Container, error) {
	var found *corev1.Container
	for i, c := range d.Spec.Template.Spec.Containers {
		img := c.Image[strings.LastIndex(c.Image, "/")+1:]
		if img == "baton" || strings.HasPrefix(img, "baton:") || strings.HasPrefix(img, "baton@") {
			if found != nil {
				return nil, errors.New("more than one baton container")
			}
			found = &d.Spec.Template.Spec.Containers[i]
		}
	}
	if found == nil {
		return nil, errors.New("no baton container")
	}
	return found, nil
}

// served are the HTTP paths every role answers on --port whatever its
// state; the OpenAI routes are the router's and standalone's only.
var served = []string{"/health", "/metrics", "/server_info"}

// problems checks one build against what baton serves and how Kubernetes
// routes to it, and lists everything wrong (nothing when all is well).
func problems(m *manifests, gpu bool) []string {
	var out []string
	bad := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }

	type pod struct {
		d     *appsv1.Deployment
		c     *corev1.Container
		f     map[string][]string
		role  string
		ports map[string]int32 // container ports by name
	}
	var pods []*pod
	for _, d := range m.deployments {
		c, err := batonContainer(d)
		if err != nil {
			bad("Deployment %s: %v", d.Name, err)
			continue
		}
		args, err := expand(c)
		if err != nil {
			bad("Deployment %s: %v", d.Name, err)
		}
		f, err := flags(args)
		if err != nil {
			bad("Deployment %s: %v", d.Name, err)
			continue
		}
		p := &pod{d: d, c: c, f: f, role: last(f, "role", "standalone"), ports: map[string]int32{}}
		for _, cp := range c.Ports {
			if _, dup := p.ports[cp.Name]; dup || cp.Name == "" {
				bad("Deployment %s: container port %d has an empty or repeated name %q", d.Name, cp.ContainerPort, cp.Name)
			}
			p.ports[cp.Name] = cp.ContainerPort
		}
		pods = append(pods, p)
	}
	roleOf := map[string][]*pod{}
	for _, p := range pods {
		roleOf[p.role] = append(roleOf[p.role], p)
	}
	for _, role := range []string{"router", "prefill", "decode"} {
		if len(roleOf[role]) != 1 {
			bad("%d Deployments run the %s role, want 1", len(roleOf[role]), role)
		}
	}
	selects := func(sel map[string]string, p *pod) bool {
		return len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(p.d.Spec.Template.Labels))
	}
	selectsLS := func(ls *metav1.LabelSelector, p *pod) bool {
		s, err := metav1.LabelSelectorAsSelector(ls)
		return err == nil && ls != nil && !s.Empty() && s.Matches(labels.Set(p.d.Spec.Template.Labels))
	}
	intFlag := func(p *pod, name string) int32 {
		v, err := strconv.Atoi(last(p.f, name, "0"))
		if err != nil {
			bad("Deployment %s: --%s=%q is not a number", p.d.Name, name, last(p.f, name, ""))
		}
		return int32(v)
	}

	for _, p := range pods {
		d, c, name := p.d, p.c, p.d.Name
		spec := &d.Spec.Template.Spec
		// The Deployment owns exactly its own pods.
		for _, o := range pods {
			if own := selectsLS(d.Spec.Selector, o); own != (o == p) {
				bad("Deployment %s: selector %v matches pods of %s: %v", name, d.Spec.Selector, o.d.Name, own)
			}
		}
		if comp := d.Spec.Template.Labels["app.kubernetes.io/component"]; comp != p.role {
			bad("Deployment %s: pods labelled component %q run role %q", name, comp, p.role)
		}

		// Ports: what the container declares is what baton listens on.
		httpPort := intFlag(p, "port")
		want := map[string]int32{"http": httpPort}
		if p.role == "prefill" || p.role == "decode" {
			want["grpc"] = intFlag(p, "grpc-port")
		}
		if p.role == "decode" {
			want["transfer"] = intFlag(p, "transfer-port")
		}
		for n, v := range want {
			if v == 0 {
				bad("Deployment %s: --%s-port is 0 (a random port no Service or probe can name)", name, n)
			}
			if p.ports[n] != v {
				bad("Deployment %s: container port %q is %d, baton listens on %d", name, n, p.ports[n], v)
			}
		}
		if len(p.ports) != len(want) {
			bad("Deployment %s: container ports %v, baton (role %s) listens on %v", name, p.ports, p.role, want)
		}
		if h := last(p.f, "host", "127.0.0.1"); h != "0.0.0.0" && h != "::" {
			bad("Deployment %s: --host=%s is not reachable from other pods", name, h)
		}

		// Probes ask real endpoints on the HTTP port.
		probe := func(kind string, pr *corev1.Probe, path string) {
			if pr == nil {
				bad("Deployment %s: no %s probe", name, kind)
				return
			}
			g := pr.HTTPGet
			if g == nil {
				bad("Deployment %s: the %s probe is not an HTTP GET", name, kind)
				return
			}
			if (path != "" && g.Path != path) || !slices.Contains(served, g.Path) {
				bad("Deployment %s: %s probe asks %s, want %s (baton serves %v)", name, kind, g.Path, cmp(path, "one of them"), served)
			}
			if port := resolvePort(g.Port, p.ports); port != httpPort {
				bad("Deployment %s: %s probe port %s is %d, not the HTTP port %d", name, kind, g.Port.String(), port, httpPort)
			}
		}
		// Readiness follows /health: 200 only once the model is loaded (a
		// router: once a healthy pair exists), 503 while draining. A
		// worker's start-up probe waits for the model too; a router's
		// must not wait for the workers, or slow workers restart it.
		probe("readiness", c.ReadinessProbe, "/health")
		if p.role == "router" {
			probe("startup", c.StartupProbe, "")
		} else {
			probe("startup", c.StartupProbe, "/health")
		}
		probe("liveness", c.LivenessProbe, "")
		if p.role == "router" && c.StartupProbe != nil && c.StartupProbe.HTTPGet != nil && c.StartupProbe.HTTPGet.Path == "/health" {
			bad("Deployment %s: the router's start-up probe asks /health, which waits for the workers", name)
		}
		if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path == "/health" {
			bad("Deployment %s: liveness asks /health, which is 503 while draining (and, on a router, while the workers are down)", name)
		}

		// Shutdown: preStop, then SIGTERM and --shutdown-timeout, all
		// within the grace period.
		shutdown, err := time.ParseDuration(last(p.f, "shutdown-timeout", "30s"))
		if err != nil {
			bad("Deployment %s: --shutdown-timeout: %v", name, err)
		}
		var preStop time.Duration
		if lc := c.Lifecycle; lc == nil || lc.PreStop == nil {
			bad("Deployment %s: no preStop hook", name)
		} else if s := lc.PreStop.Sleep; s != nil {
			preStop = time.Duration(s.Seconds) * time.Second
		}
		grace := 30 * time.Second
		if spec.TerminationGracePeriodSeconds != nil {
			grace = time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
		}
		if need := preStop + shutdown + 5*time.Second; grace < need {
			bad("Deployment %s: terminationGracePeriodSeconds %v < preStop %v + --shutdown-timeout %v + 5s", name, grace, preStop, shutdown)
		}

		// Resources.
		res := c.Resources
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, okR := res.Requests[r]
			lim, okL := res.Limits[r]
			if !okR || !okL {
				bad("Deployment %s: no %s request and limit", name, r)
			} else if req.Cmp(lim) > 0 {
				bad("Deployment %s: %s request %s above its limit %s", name, r, req.String(), lim.String())
			}
		}
		gpus := res.Limits["nvidia.com/gpu"]
		onGPU := !gpus.IsZero()
		if p.role != "router" {
			if cpuLim, ok := res.Limits[corev1.ResourceCPU]; ok {
				threads := intFlag(p, "threads")
				if threads < 1 || float64(threads) > math.Ceil(cpuLim.AsApproximateFloat64()) {
					bad("Deployment %s: --threads=%d, want 1..%s (the CPU limit)", name, threads, cpuLim.String())
				}
			}
			if !onGPU {
				kv, err := parseBytes(last(p.f, "kv-cache-memory", "1GiB"))
				memLim := res.Limits[corev1.ResourceMemory]
				if err != nil || kv >= memLim.Value() {
					bad("Deployment %s: --kv-cache-memory %s does not fit the memory limit %s (%v)", name, last(p.f, "kv-cache-memory", "1GiB"), memLim.String(), err)
				}
			}
			// A worker advertises the pod IP: 0.0.0.0 reaches nothing, and
			// decode tells writers apart by the address they give.
			raw, _ := flags(c.Args) // before $(POD_IP) is expanded
			adv := last(raw, "advertise-host", "")
			if adv != "$(POD_IP)" || !podIPEnv(c, "POD_IP") {
				bad("Deployment %s: want --advertise-host=$(POD_IP) with POD_IP from status.podIP (got %q)", name, adv)
			}
		}

		// Where the model comes from.
		model := last(p.f, "model", "")
		if gpu {
			if model == "" {
				bad("Deployment %s: no --model on the GPU overlay", name)
			} else if !mounted(spec, c, model) {
				bad("Deployment %s: --model=%s is on no mounted volume", name, model)
			}
			if p.role != "router" {
				for _, r := range []corev1.ResourceName{"nvidia.com/gpu", "rdma/hca"} {
					l, r2 := res.Limits[r], res.Requests[r]
					if l.IsZero() || l.Cmp(r2) != 0 {
						bad("Deployment %s: %s limit %s request %s; want at least one, equal", name, r, l.String(), r2.String())
					}
				}
				if last(p.f, "transport", "tcp") != "ucx" || last(p.f, "device", "") != "cuda" {
					bad("Deployment %s: want --transport=ucx and --device=cuda", name)
				}
				if c.SecurityContext == nil || c.SecurityContext.Capabilities == nil || !slices.Contains(c.SecurityContext.Capabilities.Add, "IPC_LOCK") {
					bad("Deployment %s: RDMA needs IPC_LOCK", name)
				}
			}
		} else {
			if model != "" {
				bad("Deployment %s: --model=%s; this build serves the bundled model", name, model)
			}
			if onGPU {
				bad("Deployment %s: asks for a GPU on a CPU build", name)
			}
		}
		for _, vm := range c.VolumeMounts {
			if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name }) {
				bad("Deployment %s: mounts volume %q, which the pod does not define", name, vm.Name)
			}
		}
		for _, v := range spec.Volumes {
			if pvc := v.PersistentVolumeClaim; pvc != nil && !slices.ContainsFunc(m.pvcs, func(c *corev1.PersistentVolumeClaim) bool { return c.Name == pvc.ClaimName }) {
				bad("Deployment %s: claim %s is not in the build", name, pvc.ClaimName)
			}
		}

		// Hardening: non-root unless RDMA needs a capability only root
		// gets; nothing else added.
		sc, psc := c.SecurityContext, spec.SecurityContext
		addsIPCLock := sc != nil && sc.Capabilities != nil && slices.Contains(sc.Capabilities.Add, "IPC_LOCK")
		if !addsIPCLock && (psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot) {
			bad("Deployment %s: runs as root without needing to", name)
		}
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			bad("Deployment %s: container securityContext is not locked down (no privilege escalation, read-only root, drop ALL)", name)
		}
		if sc != nil && sc.Capabilities != nil {
			for _, a := range sc.Capabilities.Add {
				if a != "IPC_LOCK" || !gpu {
					bad("Deployment %s: adds capability %s", name, a)
				}
			}
		}

		// Exactly one PodDisruptionBudget, and one that lets a node drain.
		var budgets []*policyv1.PodDisruptionBudget
		for _, b := range m.pdbs {
			if selectsLS(b.Spec.Selector, p) {
				budgets = append(budgets, b)
			}
		}
		if len(budgets) != 1 {
			bad("Deployment %s: %d PodDisruptionBudgets cover it, want 1", name, len(budgets))
		}
		replicas := int32(1)
		if d.Spec.Replicas != nil {
			replicas = *d.Spec.Replicas
		}
		for _, b := range budgets {
			for _, o := range pods {
				if o != p && selectsLS(b.Spec.Selector, o) {
					bad("PodDisruptionBudget %s: also covers %s", b.Name, o.d.Name)
				}
			}
			ok := false
			switch {
			case b.Spec.MaxUnavailable != nil:
				v, err := intstr.GetScaledValueFromIntOrPercent(b.Spec.MaxUnavailable, int(replicas), true)
				ok = err == nil && v >= 1
			case b.Spec.MinAvailable != nil:
				v, err := intstr.GetScaledValueFromIntOrPercent(b.Spec.MinAvailable, int(replicas), true)
				ok = err == nil && int32(v) < replicas
			}
			if !ok {
				bad("PodDisruptionBudget %s: allows no disruption of %d replicas: a node drain would hang", b.Name, replicas)
			}
		}
	}

	// Services select exactly the pods of their component, and their
	// target ports exist on them.
	svcRole := map[string]*corev1.Service{}
	for _, s := range m.services {
		comp := s.Labels["app.kubernetes.io/component"]
		var selected []*pod
		for _, p := range pods {
			if selects(s.Spec.Selector, p) {
				selected = append(selected, p)
			}
		}
		if len(selected) != 1 || selected[0].role != comp {
			var names []string
			for _, p := range selected {
				names = append(names, p.d.Name)
			}
			bad("Service %s (component %s): selects %v, want the %s Deployment alone", s.Name, comp, names, comp)
			continue
		}
		p := selected[0]
		headless := s.Spec.ClusterIP == corev1.ClusterIPNone
		if headless != (p.role != "router") {
			bad("Service %s: headless %v; workers need headless Services (the router resolves pod IPs), the router a virtual IP", s.Name, headless)
		}
		for _, sp := range s.Spec.Ports {
			tp := sp.TargetPort
			if tp.Type == intstr.Int && tp.IntVal == 0 {
				tp = intstr.FromInt32(sp.Port)
			}
			if port := resolvePort(tp, p.ports); port == 0 || (headless && port != sp.Port) {
				bad("Service %s: port %s targets %s, which is not a container port of %s (or differs from the port a headless Service's DNS users dial)", s.Name, sp.Name, tp.String(), p.d.Name)
			}
		}
		svcRole[s.Name] = s
	}

	// The router finds each worker role through a headless Service's DNS.
	for _, r := range roleOf["router"] {
		for _, role := range []string{"prefill", "decode"} {
			urls := r.f[role]
			if len(urls) == 0 {
				bad("router: no --%s", role)
			}
			for _, raw := range urls {
				for _, one := range strings.Split(raw, ",") {
					u, err := url.Parse(one)
					if err != nil || u.Scheme != "dns+http" {
						bad("router: --%s=%s is not a dns+http URL: scaling would need a router restart", role, one)
						continue
					}
					s := svcRole[u.Hostname()]
					if s == nil {
						bad("router: --%s=%s names no Service of the build", role, one)
						continue
					}
					if s.Labels["app.kubernetes.io/component"] != role || s.Spec.ClusterIP != corev1.ClusterIPNone {
						bad("router: --%s=%s names Service %s, which is not the headless %s Service", role, one, s.Name, role)
					}
					for _, w := range roleOf[role] {
						if port, _ := strconv.Atoi(u.Port()); int32(port) != intFlag(w, "port") {
							bad("router: --%s=%s dials port %s, the %s pods listen on %d", role, one, u.Port(), role, intFlag(w, "port"))
						}
					}
				}
			}
		}
	}
	return out
}

func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// resolvePort turns a probe's or Service's target port (a name or a
// number) into the container port it reaches; 0 means none.
func resolvePort(p intstr.IntOrString, ports map[string]int32) int32 {
	if p.Type == intstr.String {
		return ports[p.StrVal]
	}
	for _, v := range ports {
		if v == p.IntVal {
			return v
		}
	}
	return 0
}

func podIPEnv(c *corev1.Container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name {
			return e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP"
		}
	}
	return false
}

// mounted says whether path lies on one of the container's volume mounts
// backed by a persistent volume claim.
func mounted(spec *corev1.PodSpec, c *corev1.Container, path string) bool {
	for _, vm := range c.VolumeMounts {
		if !strings.HasPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/") {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == vm.Name && v.PersistentVolumeClaim != nil {
				return true
			}
		}
	}
	return false
}

// parseBytes reads baton's size syntax (512MiB, 2GiB) with the
// Kubernetes quantity parser, which takes the same binary suffixes less
// the B.
func parseBytes(s string) (int64, error) {
	q, err := resource.ParseQuantity(strings.TrimSuffix(s, "B"))
	if err != nil {
		return 0, err
	}
	return q.Value(), nil
}

func TestManifests(t *testing.T) {
	for _, dir := range builds {
		t.Run(dir, func(t *testing.T) {
			m, err := build(filesys.MakeFsOnDisk(), dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(m.deployments) != 3 || len(m.services) != 3 || len(m.pdbs) != 3 {
				t.Errorf("%d Deployments, %d Services, %d PodDisruptionBudgets; want 3 of each", len(m.deployments), len(m.services), len(m.pdbs))
			}
			for _, p := range problems(m, strings.Contains(dir, "gpu")) {
				t.Error(p)
			}
		})
	}
}

// TestArgsParseWithBaton runs every container's args through baton's own
// flag parsing and validation (`serve --dry-run`), so that a flag baton
// does not have, or a value it refuses, fails here and not in a cluster.
func TestArgsParseWithBaton(t *testing.T) {
	for _, dir := range builds {
		// The GPU image is built with the ucx tag (deploy/docker/Dockerfile),
		// and only such a build takes --transport=ucx.
		tags := ""
		if strings.Contains(dir, "gpu") {
			tags = "ucx"
		}
		bin := batonBinary(t, tags)
		if out, err := dryRun(bin, []string{"serve"}, nil); err != nil {
			t.Fatalf("baton serve --dry-run (the bundled standalone server) failed; these tests need --dry-run "+
				"to parse and validate flags and exit 0 without loading the model: %v\n%s", err, out)
		}
		// The check itself must be able to fail.
		if out, err := dryRun(bin, []string{"serve", "--role=prefill", "--no-such-flag=1"}, nil); err == nil || !strings.Contains(out, "unknown flag") {
			t.Fatalf("a dry run with an unknown flag: err %v, output:\n%s", err, out)
		}
		m, err := build(filesys.MakeFsOnDisk(), dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range m.deployments {
			t.Run(dir+"/"+d.Name, func(t *testing.T) {
				c, err := batonContainer(d)
				if err != nil {
					t.Fatal(err)
				}
				args, err := expand(c)
				if err != nil {
					t.Fatal(err)
				}
				if out, err := dryRun(bin, args, c.Env); err != nil {
					t.Errorf("baton %s --dry-run (build tags %q): %v\n%s", strings.Join(args, " "), tags, err, out)
				}
			})
		}
	}
}

// dryRun runs baton with args and --dry-run, in an environment holding the
// container's plain env values (BATON_* among them, which baton reads as
// flags) and none of the caller's BATON_* settings.
func dryRun(bin string, args []string, env []corev1.EnvVar) (string, error) {
	cmd := exec.Command(bin, append(slices.Clone(args), "--dry-run")...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BATON_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for _, e := range env {
		if e.ValueFrom == nil {
			cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
		}
	}
	cmd.WaitDelay = 5 * time.Second
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return string(out), errors.New("still running after 30s: --dry-run must not serve")
	}
	return string(out), err
}

// batonBinary is $BATON_TEST_BINARY (a release build, which has every
// tag), or baton built from this tree with tags for this test run: never a
// bin/baton left by an older `make build`, whose flags may not be the ones
// the manifests are checked against.
func batonBinary(t *testing.T, tags string) string {
	t.Helper()
	if p := os.Getenv("BATON_TEST_BINARY"); p != "" {
		return p
	}
	return harness.Build(t, tags)
}

func TestMain(m *testing.M) {
	code := m.Run()
	harness.Cleanup()
	os.Exit(code)
}

// TestChecksCatchMistakes breaks the base in the ways a manifest edit
// could and expects each to be caught: checks that pass on anything would
// pass on the real manifests too.
func TestChecksCatchMistakes(t *testing.T) {
	for _, tc := range []struct {
		name, file, old, new, want string
	}{
		{"probe path", "prefill.yaml", "path: /health", "path: /healthz", "readiness probe asks /healthz"},
		{"probe port", "decode.yaml", "              port: http\n            periodSeconds: 5\n            failureThreshold: 2", "              port: grpc\n            periodSeconds: 5\n            failureThreshold: 2", "readiness probe port grpc"},
		{"service name", "router.yaml", "dns+http://baton-prefill-headless:8100", "dns+http://baton-prefill:8100", "names no Service"},
		{"plain URL", "router.yaml", "dns+http://baton-decode-headless:8200", "http://baton-decode-headless:8200", "not a dns+http URL"},
		{"worker port", "router.yaml", "dns+http://baton-prefill-headless:8100", "dns+http://baton-prefill-headless:8101", "dials port 8101"},
		{"grace period", "decode.yaml", "terminationGracePeriodSeconds: 135", "terminationGracePeriodSeconds: 60", "terminationGracePeriodSeconds 1m0s"},
		{"service selects all", "decode.yaml", "  clusterIP: None\n  selector:\n    app.kubernetes.io/component: decode", "  clusterIP: None\n  selector:\n    app.kubernetes.io/name: baton", "selects [baton-router baton-prefill baton-decode]"},
		{"container port", "prefill.yaml", "containerPort: 8101", "containerPort: 9101", `container port "grpc" is 9101`},
		{"no advertise host", "decode.yaml", "            - --advertise-host=$(POD_IP)\n", "", "--advertise-host"},
		{"undefined variable", "prefill.yaml", "--advertise-host=$(POD_IP)", "--advertise-host=$(POD_ADDR)", "does not define"},
		{"unknown field", "prefill.yaml", "readinessProbe:", "readinesProbe:", "unknown field"},
		{"blocking budget", "decode.yaml", "  maxUnavailable: 1", "  minAvailable: 1", "allows no disruption"},
		{"threads", "prefill.yaml", "--threads=2", "--threads=16", "--threads=16"},
		{"root", "router.yaml", "runAsNonRoot: true", "runAsNonRoot: false", "runs as root"},
		{"liveness on health", "decode.yaml", "path: /metrics", "path: /health", "liveness asks /health"},
		{"router waits for workers", "router.yaml", "              path: /metrics\n              port: http\n            periodSeconds: 2", "              path: /health\n              port: http\n            periodSeconds: 2", "start-up probe asks /health"},
		{"kv pool", "decode.yaml", "--transfer-port=8202", "--transfer-port=8202\n            - --kv-cache-memory=4GiB", "does not fit the memory limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := filesys.MakeFsInMemory()
			for _, f := range []string{"kustomization.yaml", "router.yaml", "prefill.yaml", "decode.yaml"} {
				b, err := os.ReadFile(filepath.Join("base", f))
				if err != nil {
					t.Fatal(err)
				}
				s := string(b)
				if f == tc.file {
					if !strings.Contains(s, tc.old) {
						t.Fatalf("test setup: %s has no %q", f, tc.old)
					}
					s = strings.Replace(s, tc.old, tc.new, 1)
				}
				if err := fs.WriteFile(filepath.Join("/k", f), []byte(s)); err != nil {
					t.Fatal(err)
				}
			}
			var found []string
			m, err := build(fs, "/k")
			if err != nil {
				found = []string{err.Error()}
			} else {
				found = problems(m, false)
			}
			for _, p := range found {
				if strings.Contains(p, tc.want) {
					t.Log("caught:", p)
					return
				}
			}
			t.Errorf("no problem mentions %q; found %q", tc.want, found)
		})
	}
}
