// Package k8s holds baton's Kubernetes manifests (a kustomize base and
// overlays) and the tests that build them the way kubectl apply -k does and
// check them against what baton actually serves.
package k8s

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"math/big"
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
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/batonlm/baton/internal/auth"
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
	policies    []*networkingv1.NetworkPolicy
	certs       []*certificate
	issuers     []*issuer
}

// certificate and issuer are the parts of cert-manager's Certificate and
// Issuer (cert-manager.io/v1, CRDs: k8s.io/api has no types for them) that
// the manifests use. Decoded strictly, a field this test does not know
// fails the build, and must be added here and checked.
type certificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		IsCA        bool     `json:"isCA,omitempty"`
		CommonName  string   `json:"commonName,omitempty"`
		SecretName  string   `json:"secretName"`
		URIs        []string `json:"uris,omitempty"`
		Usages      []string `json:"usages,omitempty"`
		Duration    string   `json:"duration,omitempty"`
		RenewBefore string   `json:"renewBefore,omitempty"`
		PrivateKey  *struct {
			Algorithm      string `json:"algorithm,omitempty"`
			Size           int    `json:"size,omitempty"`
			RotationPolicy string `json:"rotationPolicy,omitempty"`
		} `json:"privateKey,omitempty"`
		IssuerRef issuerRef `json:"issuerRef"`
	} `json:"spec"`
}

type issuerRef struct {
	Name  string `json:"name"`
	Kind  string `json:"kind,omitempty"`
	Group string `json:"group,omitempty"`
}

type issuer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SelfSigned *struct{} `json:"selfSigned,omitempty"`
		CA         *struct {
			SecretName string `json:"secretName"`
		} `json:"ca,omitempty"`
	} `json:"spec"`
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
		case "NetworkPolicy":
			p := &networkingv1.NetworkPolicy{}
			m.policies, into, want = append(m.policies, p), p, "networking.k8s.io/v1"
		case "Certificate":
			c := &certificate{}
			m.certs, into, want = append(m.certs, c), c, "cert-manager.io/v1"
		case "Issuer":
			i := &issuer{}
			m.issuers, into, want = append(m.issuers, i), i, "cert-manager.io/v1"
		case "Secret":
			return nil, fmt.Errorf("%s: a Secret in a kustomization puts its value in git (or in a file beside it); "+
				"the operator creates it (deploy/README.md) or cert-manager issues it", id)
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

// pod is what the checks know of one Deployment's pods.
type pod struct {
	d     *appsv1.Deployment
	c     *corev1.Container
	f     map[string][]string
	role  string
	ports map[string]int32 // container ports by name
}

// problems checks one build against what baton serves and how Kubernetes
// routes to it, and lists everything wrong (nothing when all is well).
func problems(m *manifests, gpu bool) []string {
	var out []string
	bad := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }

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
		// A decode worker hands its requests back to the router after
		// --drain-grace; past --shutdown-timeout it would be cut off first.
		if p.role == "decode" {
			if dg, err := time.ParseDuration(last(p.f, "drain-grace", "10s")); err != nil {
				bad("Deployment %s: --drain-grace: %v", name, err)
			} else if dg+5*time.Second > shutdown {
				bad("Deployment %s: --drain-grace %v leaves less than 5s of --shutdown-timeout %v to hand requests back", name, dg, shutdown)
			}
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

	out = append(out, authProblems(m, pods)...)
	out = append(out, policyProblems(m, pods)...)

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
			if len(m.deployments) != 3 || len(m.services) != 3 || len(m.pdbs) != 3 || len(m.policies) != 3 {
				t.Errorf("%d Deployments, %d Services, %d PodDisruptionBudgets, %d NetworkPolicies; want 3 of each",
					len(m.deployments), len(m.services), len(m.pdbs), len(m.policies))
			}
			for _, p := range problems(m, strings.Contains(dir, "gpu")) {
				t.Error(p)
			}
		})
	}
}

// secretValues lists the Secrets with data, and the secretGenerators, in
// one YAML file (of one or more documents): a value there is in git.
func secretValues(name string, b []byte) []string {
	var out []string
	for i, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(b), -1) {
		var o struct {
			Kind            string         `json:"kind"`
			Data            map[string]any `json:"data"`
			StringData      map[string]any `json:"stringData"`
			SecretGenerator []any          `json:"secretGenerator"`
		}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			out = append(out, fmt.Sprintf("%s, document %d: %v", name, i+1, err))
			continue
		}
		if o.Kind == "Secret" && len(o.Data)+len(o.StringData) > 0 {
			out = append(out, fmt.Sprintf("%s, document %d: a Secret with data", name, i+1))
		}
		if len(o.SecretGenerator) > 0 {
			out = append(out, fmt.Sprintf("%s, document %d: a secretGenerator", name, i+1))
		}
	}
	return out
}

// TestNoSecretValues: no file under deploy/ holds a Secret's value. The
// cluster secret is created in the cluster (deploy/README.md), the
// certificates by cert-manager.
func TestNoSecretValues(t *testing.T) {
	if got := secretValues("example", []byte("kind: ConfigMap\n---\nkind: Secret\nstringData:\n  secret: x\n")); len(got) != 1 {
		t.Errorf("a Secret with stringData: found %q, want it", got)
	}
	n := 0
	err := filepath.WalkDir("..", func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() || (filepath.Ext(path) != ".yaml" && filepath.Ext(path) != ".yml") {
			return err
		}
		b, err := os.ReadFile(path)
		n++
		for _, p := range secretValues(path, b) {
			t.Error(p)
		}
		return err
	})
	if err != nil || n == 0 {
		t.Fatalf("walking deploy/: %v (%d YAML files)", err, n)
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
				env := c.Env
				if authFlagsInBaton {
					args, env = withAuthFiles(t, args, env)
				} else {
					out, err := dryRun(bin, args, env)
					if err == nil || !unknownAuthFlag(out) {
						t.Errorf("baton %s --dry-run: want a refusal of an internal-auth flag %v and nothing else; "+
							"if baton has them now, set authFlagsInBaton: %v\n%s", strings.Join(args, " "), authFlags, err, out)
					}
					args, env = withoutAuthFlags(args, env)
				}
				if out, err := dryRun(bin, args, env); err != nil {
					t.Errorf("baton %s --dry-run (build tags %q): %v\n%s", strings.Join(args, " "), tags, err, out)
				}
			})
		}
	}
}

// authFlagsInBaton says whether the baton of this tree has the
// internal-auth flags the manifests pass (--cluster-secret-file,
// --internal-tls-*). It does: every dry run takes them, pointed at files the
// test writes in place of the mounted Secrets, so a name the manifests and
// baton spell differently fails here. Set to false, each dry run must instead
// be refused for exactly such a flag and is run again without them (for a
// tree whose manifests run ahead of its binary).
const authFlagsInBaton = true

func isAuthFlag(arg string) bool {
	name, _, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
	return strings.HasPrefix(arg, "--") && slices.Contains(authFlags, name)
}

func authEnv(name string) bool {
	return slices.ContainsFunc(authFlags, func(f string) bool { return name == envName(f) })
}

func unknownAuthFlag(out string) bool {
	return slices.ContainsFunc(authFlags, func(f string) bool { return strings.Contains(out, "unknown flag: --"+f) })
}

func withoutAuthFlags(args []string, env []corev1.EnvVar) ([]string, []corev1.EnvVar) {
	return slices.DeleteFunc(slices.Clone(args), isAuthFlag),
		slices.DeleteFunc(slices.Clone(env), func(e corev1.EnvVar) bool { return authEnv(e.Name) })
}

// withAuthFiles points the internal-auth flags (and env) at files like the
// ones the Secrets hold: a cluster secret, and a CA with a certificate for
// the args' role, as cert-manager writes them.
func withAuthFiles(t *testing.T, args []string, env []corev1.EnvVar) ([]string, []corev1.EnvVar) {
	t.Helper()
	dir := t.TempDir()
	f, err := flags(args)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{clusterSecretFlag: filepath.Join(dir, roleKeyKey)}
	secret := make([]byte, 48)
	_, _ = rand.Read(secret)
	write := func(path string, b []byte) {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	role := last(f, "role", "standalone")
	// The role's key file, as `baton keys derive` writes it: baton refuses
	// another role's, so a manifest that mounts the wrong one fails here.
	if r, err := auth.ParseRole(role); err == nil {
		key, err := auth.RoleKeyFile([]byte(base64.StdEncoding.EncodeToString(secret)), r)
		if err != nil {
			t.Fatal(err)
		}
		write(files[clusterSecretFlag], key)
	} else {
		write(files[clusterSecretFlag], []byte(base64.StdEncoding.EncodeToString(secret)))
	}
	pems := testCerts(t, role)
	for _, tf := range tlsFlags {
		files[tf.flag] = filepath.Join(dir, tf.key)
		write(files[tf.flag], pems[tf.key])
	}
	args = slices.Clone(args)
	for i, a := range args {
		if isAuthFlag(a) {
			name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			args[i] = "--" + name + "=" + files[name]
		}
	}
	env = slices.Clone(env)
	for i, e := range env {
		for _, name := range authFlags {
			if e.Name == envName(name) {
				env[i] = corev1.EnvVar{Name: e.Name, Value: files[name]}
			}
		}
	}
	return args, env
}

// testCerts makes a CA and a certificate for role signed by it, PEM-encoded
// under the keys cert-manager uses (tls.crt, tls.key, ca.crt).
func testCerts(t *testing.T, role string) map[string][]byte {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey, leafKey := key(), key()
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(roleURIPrefix + role)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), URIs: []*url.URL{u},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		"ca.crt":  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
	}
}

// TestAuthFilesForDryRun checks what withAuthFiles gives baton, since
// --dry-run checks the flags but does not load the files: files in place of
// every auth flag's, a secret long enough, and a certificate that verifies
// against the CA for both ends with the role's URI SAN.
func TestAuthFilesForDryRun(t *testing.T) {
	in := []string{"serve", "--role=decode", "--host=0.0.0.0", "--cluster-secret-file=/etc/baton/role-key/key",
		"--internal-tls-cert=/etc/baton/tls/tls.crt", "--internal-tls-key=/etc/baton/tls/tls.key", "--internal-tls-ca=/etc/baton/tls/ca.crt"}
	args, env := withAuthFiles(t, in, []corev1.EnvVar{{Name: envName(clusterSecretFlag), Value: "/nowhere"}})
	f, err := flags(args)
	if err != nil {
		t.Fatal(err)
	}
	read := func(path string) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := auth.New(auth.Options{Role: auth.RoleDecode, Name: "d", SecretFile: last(f, clusterSecretFlag, "")}); err != nil {
		t.Errorf("the decode key file: %v", err)
	}
	if _, err := auth.New(auth.Options{Role: auth.RolePrefill, Name: "p", SecretFile: last(f, clusterSecretFlag, "")}); err == nil {
		t.Error("the decode key file made a prefill member")
	}
	if env[0].Value != last(f, clusterSecretFlag, "") {
		t.Errorf("env %s=%s, want the written secret", env[0].Name, env[0].Value)
	}
	pair, err := tls.LoadX509KeyPair(last(f, "internal-tls-cert", ""), last(f, "internal-tls-key", ""))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(read(last(f, "internal-tls-ca", ""))) {
		t.Fatal("no CA certificate in ca.crt")
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			t.Errorf("usage %v: %v", u, err)
		}
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "baton://role/decode" {
		t.Errorf("URIs %v, want [baton://role/decode]", leaf.URIs)
	}
	if a, e := withoutAuthFlags(in, env); !slices.Equal(a, in[:3]) || len(e) != 0 {
		t.Errorf("without the auth flags: %q, env %v", a, e)
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
		{"grace period", "decode.yaml", "terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds 30s"},
		{"drain grace past shutdown", "decode.yaml", "--drain-grace=10s", "--drain-grace=40s", "--drain-grace 40s leaves less than 5s"},
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

		// Internal auth.
		{"no auth", "router.yaml", "            - --cluster-secret-file=/etc/baton/role-key/key\n", "", "Deployment baton-router: no internal auth"},
		{"insecure", "prefill.yaml", "--threads=2", "--threads=2\n            - --insecure-internal=true", "--insecure-internal lets any pod"},
		{"insecure by env", "decode.yaml", "          env:\n", "          env:\n            - name: BATON_INSECURE_INTERNAL\n              value: \"true\"\n", "Deployment baton-decode: --insecure-internal lets any pod"},
		{"secret not mounted", "decode.yaml", "mountPath: /etc/baton/role-key", "mountPath: /etc/baton/secret", "is on no mounted Secret volume"},
		{"wrong key", "prefill.yaml", "--cluster-secret-file=/etc/baton/role-key/key", "--cluster-secret-file=/etc/baton/role-key/token", `want key "key"`},
		{"another role's key", "router.yaml", "secretName: baton-router-key", "secretName: baton-prefill-key", "role key from Secret baton-prefill-key, want baton-router-key"},
		{"one secret for all", "decode.yaml", "secretName: baton-decode-key", "secretName: baton-cluster-secret", "role key from Secret baton-cluster-secret, want baton-decode-key"},
		{"optional secret", "decode.yaml", "optional: false", "optional: true", "is optional"},
		{"secret in the build", "kustomization.yaml", "resources:\n", "secretGenerator:\n  - name: baton-prefill-key\n    literals: [key=0123456789abcdef0123456789abcdef]\nresources:\n", "a Secret in a kustomization"},
		{"half of mTLS", "decode.yaml", "--shutdown-timeout=30s", "--shutdown-timeout=30s\n            - --internal-tls-cert=/etc/baton/role-key/tls.crt", "both --cluster-secret-file and [internal-tls-cert]"},

		// NetworkPolicy.
		{"transfer open", "networkpolicy.yaml", "    - from:\n        - podSelector:\n            matchLabels:\n              app.kubernetes.io/component: prefill\n      ports:\n        - port: transfer", "    - ports:\n        - port: transfer", "decode port transfer (8202): reachable from [decode outside prefill router stranger], want [prefill]"},
		{"router cut off", "networkpolicy.yaml", "    - from:\n        - podSelector:\n            matchLabels:\n              app.kubernetes.io/component: router\n        - podSelector:\n            matchLabels:\n              app.kubernetes.io/component: prefill\n", "    - from:\n        - podSelector:\n            matchLabels:\n              app.kubernetes.io/component: prefill\n", "decode port grpc (8201): reachable from [prefill], want [prefill router]"},
		{"decode cannot abort", "networkpolicy.yaml", "              app.kubernetes.io/component: decode\n      ports:\n        - port: grpc", "              app.kubernetes.io/component: router\n      ports:\n        - port: grpc", "prefill port grpc (8101): reachable from [router], want [decode router]"},
		{"all ports", "networkpolicy.yaml", "  ingress:\n    - ports:\n        - port: http\n    # The router reserves", "  ingress:\n    - {}\n    # The router reserves", "decode port grpc (8201): reachable from [decode outside prefill router stranger]"},
		{"namespace peer", "networkpolicy.yaml", "        - podSelector:\n            matchLabels:\n              app.kubernetes.io/component: decode\n", "        - namespaceSelector: {}\n", "prefill port grpc (8101): reachable from [decode outside prefill router stranger]"},
		{"no policy", "kustomization.yaml", "  - networkpolicy.yaml\n", "", "decode port transfer (8202): reachable from [decode outside prefill router stranger]"},
		{"policy selects nothing", "networkpolicy.yaml", "  podSelector:\n    matchLabels:\n      app.kubernetes.io/component: prefill", "  podSelector:\n    matchLabels:\n      app.kubernetes.io/component: prefil", "NetworkPolicy baton-prefill: selects no pod"},
		{"policy port name", "networkpolicy.yaml", "        - port: transfer", "        - port: xfer", "names port xfer, which is not a container port of baton-decode"},
		{"policy follows the flag", "decode.yaml", "- --transfer-port=8202", "- --transfer-port=8302", "decode port transfer (8302): reachable from [], want [prefill]"},

		// mTLS (gpu-rdma).
		{"wrong role URI", "overlays/gpu-rdma/certificates.yaml", "baton://role/prefill", "baton://role/decode", "Deployment baton-prefill: its certificate (Certificate baton-prefill) has URIs [baton://role/decode], want [baton://role/prefill]"},
		{"another role's cert", "overlays/gpu-rdma/internal-tls.yaml", "secretName: baton-router-tls", "secretName: baton-decode-tls", "Deployment baton-router: its certificate (Certificate baton-decode)"},
		{"server only", "overlays/gpu-rdma/certificates.yaml", "usages: [digital signature, server auth, client auth]", "usages: [digital signature, server auth]", `Certificate baton-router lacks usage "client auth"`},
		{"cluster secret kept", "overlays/gpu-rdma/kustomization.yaml", "      - op: remove\n        path: /spec/template/spec/containers/0/args/3\n", "", "both --cluster-secret-file and [internal-tls-cert internal-tls-key internal-tls-ca]"},
		{"cert not mounted", "overlays/gpu-rdma/internal-tls.yaml", "              mountPath: /etc/baton/tls", "              mountPath: /etc/baton/certs", "--internal-tls-cert=/etc/baton/tls/tls.crt is on no mounted Secret volume"},
		{"no CA issuer", "overlays/gpu-rdma/certificates.yaml", "  ca:\n    secretName: baton-ca", "  selfSigned: {}", "want a CA Issuer of the build"},
		{"unknown cert-manager field", "overlays/gpu-rdma/certificates.yaml", "  isCA: true", "  isCA: true\n  subject: {}", "unknown field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A file without a directory is the base's; one in an overlay is
			// checked in that overlay's build.
			file, dir := filepath.Join("base", tc.file), "base"
			if strings.Contains(tc.file, "/") {
				file, dir = tc.file, filepath.Dir(tc.file)
			}
			fs := filesys.MakeFsInMemory()
			n := 0
			err := filepath.WalkDir(".", func(path string, e os.DirEntry, err error) error {
				if err != nil || e.IsDir() || filepath.Ext(path) != ".yaml" {
					return err
				}
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				s := string(b)
				if path == file {
					if !strings.Contains(s, tc.old) {
						t.Fatalf("test setup: %s has no %q", path, tc.old)
					}
					s, n = strings.Replace(s, tc.old, tc.new, 1), n+1
				}
				return fs.WriteFile(filepath.Join("/k", path), []byte(s))
			})
			if err != nil || n != 1 {
				t.Fatalf("test setup: copying the manifests: %v; %s edited %d times", err, file, n)
			}
			var found []string
			m, err := build(fs, filepath.Join("/k", dir))
			if err != nil {
				found = []string{err.Error()}
			} else {
				found = problems(m, strings.Contains(dir, "gpu"))
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

// Internal auth: off loopback, baton serves only cluster members, which
// prove themselves with their role's key or with mTLS (DESIGN.md, "Who may
// talk to a worker"). Without either it refuses to start, so every role
// must be given exactly one, and each file it names must be in a mounted
// Secret.
const (
	clusterSecretFlag = "cluster-secret-file"
	roleKeyKey        = "key" // the Secret baton-<role>-key's one key (deploy/README.md creates them)
	insecureFlag      = "insecure-internal"
	roleURIPrefix     = "baton://role/"
)

// roleKeySecret is the Secret that holds role's key.
func roleKeySecret(role string) string { return "baton-" + role + "-key" }

// tlsFlags are the mTLS flags and the key cert-manager gives each file in
// the Secrets it writes.
var tlsFlags = []struct{ flag, key string }{
	{"internal-tls-cert", "tls.crt"},
	{"internal-tls-key", "tls.key"},
	{"internal-tls-ca", "ca.crt"},
}

// authFlags are the flags of both modes, for the dry run (see
// TestArgsParseWithBaton).
var authFlags = []string{clusterSecretFlag, "internal-tls-cert", "internal-tls-key", "internal-tls-ca"}

// setting is a flag's value as baton sees it: the last on the command line,
// else BATON_<FLAG> from the container's env.
func setting(p *pod, name string) (string, bool) {
	if v := p.f[name]; len(v) > 0 {
		return v[len(v)-1], true
	}
	for _, e := range p.c.Env {
		if e.Name == envName(name) {
			return e.Value, true
		}
	}
	return "", false
}

// envName is the variable baton reads a flag from when the command line
// leaves it out.
func envName(flag string) string {
	return "BATON_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// secretFile finds the Secret volume of the container that holds path and
// the Secret key the file is made from; ok is false when no mounted Secret
// volume has that file.
func secretFile(p *pod, path string) (v *corev1.SecretVolumeSource, key string, readOnly, ok bool) {
	spec := &p.d.Spec.Template.Spec
	for _, vm := range p.c.VolumeMounts {
		rel, under := strings.CutPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/")
		if !under || vm.SubPath != "" {
			continue
		}
		for i := range spec.Volumes {
			sv := spec.Volumes[i].Secret
			if spec.Volumes[i].Name != vm.Name || sv == nil {
				continue
			}
			if len(sv.Items) == 0 {
				if rel != "" && !strings.Contains(rel, "/") {
					return sv, rel, vm.ReadOnly, true
				}
				continue
			}
			for _, it := range sv.Items {
				if it.Path == rel {
					return sv, it.Key, vm.ReadOnly, true
				}
			}
		}
	}
	return nil, "", false, false
}

// authProblems checks that each role runs in exactly one internal-auth
// mode, that the modes agree (a secret-mode router cannot talk to mTLS
// workers), and that each file is the right key of a mounted Secret: in
// secret mode the pod's own role's key, in mTLS mode a Certificate of
// the build whose URI SAN is the pod's role, from the CA every member
// trusts.
func authProblems(m *manifests, pods []*pod) []string {
	var out []string
	bad := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	certOf := map[string]*certificate{}
	for _, c := range m.certs {
		certOf[c.Spec.SecretName] = c
	}
	issuerOf := map[string]*issuer{}
	for _, i := range m.issuers {
		issuerOf[i.Name] = i
	}
	modes := map[string][]string{}
	issuers := map[string][]string{}
	for _, p := range pods {
		name := p.d.Name
		if _, on := setting(p, insecureFlag); on {
			bad("Deployment %s: --%s lets any pod use the control plane and the transfer port", name, insecureFlag)
		}
		file := func(flag, wantKey string) *corev1.SecretVolumeSource {
			path, _ := setting(p, flag)
			sv, key, ro, ok := secretFile(p, path)
			switch {
			case !ok:
				bad("Deployment %s: --%s=%s is on no mounted Secret volume", name, flag, path)
				return nil
			case key != wantKey:
				bad("Deployment %s: --%s=%s is key %q of Secret %s, want key %q", name, flag, path, key, sv.SecretName, wantKey)
			case !ro:
				bad("Deployment %s: --%s: the Secret %s is mounted writable", name, flag, sv.SecretName)
			}
			if sv.Optional != nil && *sv.Optional {
				bad("Deployment %s: Secret volume %s is optional: without it the pod would start and baton refuse, or run without auth", name, sv.SecretName)
			}
			return sv
		}
		_, secret := setting(p, clusterSecretFlag)
		var tls []string
		for _, f := range tlsFlags {
			if _, ok := setting(p, f.flag); ok {
				tls = append(tls, f.flag)
			}
		}
		switch {
		case secret && len(tls) > 0:
			bad("Deployment %s: both --%s and %v: give one internal-auth mode", name, clusterSecretFlag, tls)
		case secret:
			modes["secret"] = append(modes["secret"], name)
			if sv := file(clusterSecretFlag, roleKeyKey); sv != nil && sv.SecretName != roleKeySecret(p.role) {
				bad("Deployment %s: role key from Secret %s, want %s (each role mounts its own key and no other: baton refuses "+
					"another role's, and with the master secret the pod could act as every role)", name, sv.SecretName, roleKeySecret(p.role))
			}
		case len(tls) == len(tlsFlags):
			modes["mTLS"] = append(modes["mTLS"], name)
			crt, key, ca := file(tlsFlags[0].flag, tlsFlags[0].key), file(tlsFlags[1].flag, tlsFlags[1].key), file(tlsFlags[2].flag, tlsFlags[2].key)
			if crt == nil || key == nil || ca == nil {
				continue
			}
			if crt.SecretName != key.SecretName {
				bad("Deployment %s: certificate from Secret %s, key from %s", name, crt.SecretName, key.SecretName)
			}
			c := certOf[crt.SecretName]
			if c == nil {
				bad("Deployment %s: Secret %s is issued by no Certificate of the build", name, crt.SecretName)
				continue
			}
			if want := []string{roleURIPrefix + p.role}; !slices.Equal(c.Spec.URIs, want) {
				bad("Deployment %s: its certificate (Certificate %s) has URIs %v, want %v", name, c.Name, c.Spec.URIs, want)
			}
			for _, u := range []string{"server auth", "client auth"} {
				if !slices.Contains(c.Spec.Usages, u) {
					bad("Deployment %s: Certificate %s lacks usage %q: members both dial and serve", name, c.Name, u)
				}
			}
			if c.Spec.IsCA {
				bad("Deployment %s: Certificate %s is a CA", name, c.Name)
			}
			ref := c.Spec.IssuerRef
			iss := issuerOf[ref.Name]
			if (ref.Kind != "" && ref.Kind != "Issuer") || iss == nil || iss.Spec.CA == nil {
				bad("Deployment %s: Certificate %s is issued by %s %s, want a CA Issuer of the build", name, c.Name, cmp(ref.Kind, "Issuer"), ref.Name)
				continue
			}
			issuers[ref.Name] = append(issuers[ref.Name], name)
			// cert-manager puts the issuing CA in each Secret it signs as
			// ca.crt; the CA's own Secret is as good.
			if ca.SecretName != crt.SecretName && ca.SecretName != iss.Spec.CA.SecretName {
				bad("Deployment %s: --internal-tls-ca from Secret %s, which holds neither the certificate's CA nor the CA (%s)", name, ca.SecretName, iss.Spec.CA.SecretName)
			}
			root := certOf[iss.Spec.CA.SecretName]
			if root == nil || !root.Spec.IsCA {
				bad("Issuer %s: its CA Secret %s is issued by no CA Certificate of the build", iss.Name, iss.Spec.CA.SecretName)
			}
		case len(tls) > 0:
			bad("Deployment %s: %v without the rest of %v", name, tls, tlsFlags)
		default:
			bad("Deployment %s: no internal auth (--%s or --internal-tls-*): baton will not listen on --host=%s", name, clusterSecretFlag, last(p.f, "host", ""))
		}
	}
	if len(modes) > 1 {
		bad("members disagree on internal auth and cannot talk: %v", modes)
	}
	if len(issuers) > 1 {
		bad("certificates from different CAs cannot verify each other: %v", issuers)
	}
	for _, c := range m.certs {
		if d, err := time.ParseDuration(cmp(c.Spec.Duration, "2160h")); err != nil {
			bad("Certificate %s: duration: %v", c.Name, err)
		} else if rb, err := time.ParseDuration(cmp(c.Spec.RenewBefore, "0s")); err != nil || rb >= d {
			bad("Certificate %s: renewBefore %s must be shorter than its duration %s (%v)", c.Name, c.Spec.RenewBefore, d, err)
		}
	}
	return out
}

// NetworkPolicy: who may connect to which port. The gRPC port reserves,
// commits and aborts KV and the transfer port writes it, so they take
// connections from the roles that use them and no one else; HTTP ports are
// open (the router's to clients; a worker's serves only /health, /metrics
// and /server_info, to the router, probes and scrapers).
var mayReach = map[string]map[string][]string{
	"router":  {"http": anyone},
	"prefill": {"http": anyone, "grpc": {"router", "decode"}},
	"decode":  {"http": anyone, "grpc": {"router", "prefill"}, "transfer": {"prefill"}},
}

// anyone is every peer: the three roles, a pod of the namespace with no
// baton labels, and whatever is not a pod of the namespace (a node, another
// namespace, outside the cluster).
var anyone = []string{"router", "prefill", "decode", "stranger", "outside"}

// portFlags are the flags that choose each named port.
var portFlags = map[string]string{"http": "port", "grpc": "grpc-port", "transfer": "transfer-port"}

// peer is a would-be client; labels nil stands for one that is not a pod of
// the namespace.
type peer struct {
	name   string
	labels map[string]string
}

// reaches says whether the policies let from open a TCP connection to port
// of p's pods, by the NetworkPolicy rules (ingress only: no policy here
// limits egress). Peers chosen by namespace or IP block are taken to match
// anyone: the build cannot tell which namespaces or addresses they are.
func reaches(pols []*networkingv1.NetworkPolicy, from peer, p *pod, port int32) bool {
	isolated := false
	for _, np := range pols {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(p.d.Spec.Template.Labels)) {
			continue
		}
		if len(np.Spec.PolicyTypes) > 0 && !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		isolated = true
		for _, r := range np.Spec.Ingress {
			if portMatches(r.Ports, p, port) && peerMatches(r.From, from) {
				return true
			}
		}
	}
	return !isolated
}

func portMatches(ports []networkingv1.NetworkPolicyPort, p *pod, port int32) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pp := range ports {
		if pp.Protocol != nil && *pp.Protocol != corev1.ProtocolTCP {
			continue
		}
		switch {
		case pp.Port == nil:
			return true
		case pp.Port.Type == intstr.String:
			if v, ok := p.ports[pp.Port.StrVal]; ok && v == port {
				return true
			}
		case pp.EndPort != nil:
			if pp.Port.IntVal <= port && port <= *pp.EndPort {
				return true
			}
		case pp.Port.IntVal == port:
			return true
		}
	}
	return false
}

func peerMatches(from []networkingv1.NetworkPolicyPeer, pr peer) bool {
	if len(from) == 0 {
		return true
	}
	for _, f := range from {
		if f.IPBlock != nil || f.NamespaceSelector != nil {
			if f.PodSelector == nil || pr.labels == nil {
				return true
			}
		}
		if f.PodSelector == nil || pr.labels == nil {
			continue
		}
		if s, err := metav1.LabelSelectorAsSelector(f.PodSelector); err == nil && s.Matches(labels.Set(pr.labels)) {
			return true
		}
	}
	return false
}

// policyProblems computes who can reach each port of each role and
// compares it with mayReach, on the ports baton listens on (the flags), and
// checks that each policy selects pods and names ports they have: a port
// name a pod lacks matches nothing, silently.
func policyProblems(m *manifests, pods []*pod) []string {
	var out []string
	bad := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	peers := []peer{{"stranger", map[string]string{"app": "something-else"}}, {"outside", nil}}
	for _, p := range pods {
		peers = append(peers, peer{p.role, p.d.Spec.Template.Labels})
	}
	for _, p := range pods {
		want := mayReach[p.role]
		if want == nil {
			bad("Deployment %s: role %s has no row in mayReach", p.d.Name, p.role)
			continue
		}
		// A port nothing should listen on: a rule with no ports would open
		// it, and with it every port baton adds later.
		check := map[string]int32{"unused": 1}
		for n := range want {
			v, err := strconv.Atoi(last(p.f, portFlags[n], "0"))
			if err != nil || v == 0 {
				bad("Deployment %s: --%s=%q", p.d.Name, portFlags[n], last(p.f, portFlags[n], ""))
			}
			check[n] = int32(v)
		}
		for n, port := range check {
			var got []string
			for _, pr := range peers {
				if reaches(m.policies, pr, p, port) {
					got = append(got, pr.name)
				}
			}
			slices.Sort(got)
			w := slices.Sorted(slices.Values(want[n]))
			if !slices.Equal(got, w) {
				bad("NetworkPolicy: %s port %s (%d): reachable from %v, want %v", p.role, n, port, got, w)
			}
		}
	}
	for _, np := range m.policies {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			bad("NetworkPolicy %s: %v", np.Name, err)
			continue
		}
		var selected []*pod
		for _, p := range pods {
			if sel.Matches(labels.Set(p.d.Spec.Template.Labels)) {
				selected = append(selected, p)
			}
		}
		if len(selected) == 0 {
			bad("NetworkPolicy %s: selects no pod of the build", np.Name)
		}
		for _, r := range np.Spec.Ingress {
			for _, pp := range r.Ports {
				if pp.Port == nil {
					continue
				}
				for _, p := range selected {
					if resolvePort(*pp.Port, p.ports) == 0 {
						bad("NetworkPolicy %s: names port %s, which is not a container port of %s", np.Name, pp.Port.String(), p.d.Name)
					}
				}
			}
			for _, f := range r.From {
				if f.PodSelector == nil {
					continue
				}
				s, err := metav1.LabelSelectorAsSelector(f.PodSelector)
				if err != nil || !slices.ContainsFunc(pods, func(p *pod) bool { return s.Matches(labels.Set(p.d.Spec.Template.Labels)) }) {
					bad("NetworkPolicy %s: allows pods %v, which no Deployment of the build runs", np.Name, f.PodSelector.MatchLabels)
				}
			}
		}
	}
	return out
}
